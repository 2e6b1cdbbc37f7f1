// The decisions chart: uPlot, three series per second stacked into bands
// (allowed at the bottom, then limited, then shadow-limited), so the top edge
// is all decisions and each band's thickness is its share. Colours come from
// the page's CSS custom properties; the chart is rebuilt when the colour
// scheme changes. The legend is the page's own: toggle buttons for the series
// and a one-line readout of the hovered (or latest) second, in real values.

import uPlot from './vendor/uplot/uPlot.esm.js';
import { rate, clock, ticks } from './fmt.js';

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function niceCeil(v) {
  if (v <= 4) return 4;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) {
    if (m * p >= v) return m * p;
  }
  return 10 * p;
}

const NAMES = ['', 'allowed', 'limited', 'shadow-limited'];

/** DecisionsChart draws decisions per second into a container element. */
export class DecisionsChart {
  /**
   * @param {HTMLElement} el the container; the chart fills it
   * @param {HTMLElement} readout where the hovered second's values go
   * @param {NodeListOf<HTMLButtonElement>} toggles buttons with data-series="1".."3"
   */
  constructor(el, readout, toggles) {
    this.el = el;
    this.readout = readout;
    this.toggles = Array.from(toggles);
    this.raw = [[], [], [], []];
    this.show = [true, true, true, true];
    this.u = null;
    for (const b of this.toggles) {
      b.addEventListener('click', () => {
        const i = Number(b.dataset.series);
        this.show[i] = !this.show[i];
        b.setAttribute('aria-pressed', String(this.show[i]));
        this.u.setSeries(i, { show: this.show[i] });
        this.u.setData(this.stacked());
      });
    }
    this.build();
    new ResizeObserver(() => this.resize()).observe(el);
    window.matchMedia('(prefers-color-scheme: dark)').addEventListener('change', () => this.build());
  }

  size() {
    return { width: Math.max(200, this.el.clientWidth), height: Math.max(160, this.el.clientHeight) };
  }

  build() {
    if (this.u) this.u.destroy();
    const font = `12px ${css('--sans') || 'system-ui, sans-serif'}`;
    const axis = {
      stroke: css('--muted'),
      font,
      grid: { stroke: css('--grid'), width: 1 },
      ticks: { stroke: css('--grid'), width: 1, size: 4 },
    };
    const line = (name, color, extra) => ({
      label: name, stroke: css(color), width: 1.5, points: { show: false }, show: this.show[NAMES.indexOf(name)], ...extra,
    });
    const opts = {
      ...this.size(),
      pxAlign: 0,
      padding: [10, 26, 0, 0], // room for the last time label
      cursor: { drag: { x: false, y: false }, points: { show: false } },
      legend: { show: false },
      scales: {
        x: { time: true },
        y: { range: (u, min, max) => [0, niceCeil((max || 0) * 1.08)] },
      },
      axes: [
        { ...axis, space: 84, values: (u, vals) => vals.map((v) => clock(v * 1000)) },
        { ...axis, size: 46, space: 30, values: (u, vals) => ticks(vals) },
      ],
      series: [
        {},
        line('allowed', '--allowed', { fill: css('--allowed-soft') }),
        line('limited', '--limited'),
        line('shadow-limited', '--shadow', { dash: [5, 3] }),
      ],
      // Each band fills between a series and the one under it.
      bands: [
        { series: [2, 1], fill: css('--limited-band') },
        { series: [3, 2], fill: css('--shadow-band') },
      ],
      hooks: { setCursor: [() => this.showReadout()] },
    };
    this.u = new uPlot(opts, this.stacked(), this.el);
    this.showReadout();
  }

  resize() {
    const { width, height } = this.size();
    if (this.u && (this.u.width !== width || this.u.height !== height)) this.u.setSize({ width, height });
  }

  /** stacked sums the shown series bottom-up: what uPlot draws. */
  stacked() {
    const [xs, ...ys] = this.raw;
    const out = [xs];
    let acc = new Array(xs.length).fill(0);
    ys.forEach((y, k) => {
      if (this.show[k + 1]) acc = acc.map((v, i) => v + (y[i] || 0));
      out.push(acc);
    });
    return out;
  }

  showReadout() {
    const xs = this.raw[0];
    if (!xs.length) {
      this.readout.textContent = '–';
      return;
    }
    let i = this.u ? this.u.cursor.idx : null;
    const hover = i != null;
    if (!hover) i = xs.length - 1;
    const parts = [];
    for (let s = 1; s <= 3; s++) parts.push(`${rate(this.raw[s][i] ?? 0)} ${NAMES[s]}`);
    this.readout.textContent = `${hover ? '' : 'now · '}${clock(xs[i] * 1000)} — ${parts.join(' · ')} per s`;
  }

  /** set replaces the data: [xs in seconds, allowed[], limited[], shadow[]]. */
  set(data) {
    this.raw = data;
    this.u.setData(this.stacked());
    this.showReadout();
  }

  /** data is what the chart holds, unstacked: [xs, allowed, limited, shadow]. */
  get data() {
    return this.raw;
  }
}
