// Sparklines: a small SVG per rule, decisions per second over the last 60 s
// as a line with an area, and the limited ones as red bars along the bottom.

import { s } from './dom.js';

const W = 120;
const H = 28;

/** sparkline returns a new, empty sparkline SVG; draw fills it. */
export function sparkline(label) {
  const svg = s('svg', {
    class: 'spark', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none',
    role: 'img', 'aria-label': label,
  });
  svg.append(s('path', { class: 'area' }), s('path', { class: 'lim' }), s('path', { class: 'line' }));
  return svg;
}

/**
 * draw renders values (decisions per second, oldest first) and, if given,
 * limited (same length or shorter, aligned to the newest end).
 */
export function draw(svg, values, limited, label) {
  const [area, lim, line] = svg.children;
  const n = values ? values.length : 0;
  if (label) svg.setAttribute('aria-label', label);
  if (n < 2) {
    line.setAttribute('d', `M0 ${H - 1}H${W}`);
    area.setAttribute('d', '');
    lim.setAttribute('d', '');
    return;
  }
  let max = 1;
  for (const v of values) if (v > max) max = v;
  const x = (i) => (i / (n - 1)) * W;
  const y = (v) => H - 1 - (Math.max(0, v || 0) / max) * (H - 4);
  let d = '';
  for (let i = 0; i < n; i++) d += (i ? 'L' : 'M') + x(i).toFixed(1) + ' ' + y(values[i]).toFixed(1);
  line.setAttribute('d', d);
  area.setAttribute('d', `${d}L${W} ${H}L0 ${H}Z`);

  let b = '';
  if (limited && limited.length) {
    const off = n - limited.length;
    const bw = Math.max(1, W / n - 0.6);
    for (let i = 0; i < limited.length; i++) {
      const v = limited[i];
      if (!v) continue;
      const bh = Math.max(2, (v / max) * (H - 4));
      b += `M${(x(i + off) - bw / 2).toFixed(1)} ${H}h${bw.toFixed(1)}v${(-bh).toFixed(1)}h${(-bw).toFixed(1)}Z`;
    }
  }
  lim.setAttribute('d', b);
}
