// Overload protection card: the protect rules and the system section of the
// policy in force (snapshot.protect), refreshed with every poll.

import { h, setText, syncList } from './dom.js';
import * as fmt from './fmt.js';

const PRIOS = ['critical', 'normal', 'sheddable'];

const sumOf = (m) => PRIOS.reduce((a, p) => a + ((m && m[p]) || 0), 0);

export function renderProtect(snap) {
  const rules = snap.protect || [];
  document.getElementById('protect-empty').hidden = rules.length > 0;
  syncList(document.getElementById('protect-body'), rules, (r) => r.name,
    // data-label: below 700 px each rule is a card of labelled cells.
    () => h('tr', null,
      h('th', { scope: 'row', class: 'name' }), h('td', { class: 'mode', 'data-label': 'Mode' }),
      h('td', { class: 'num inflight', 'data-label': 'In flight / limit' }),
      h('td', { class: 'num', 'data-label': 'Base latency' }), h('td', { class: 'num', 'data-label': 'Admitted' }),
      h('td', { class: 'num shed', 'data-label': 'Shed c / n / s' }), h('td', { class: 'state', 'data-label': 'Breaker' }),
      h('td', { class: 'num', 'data-label': 'Refused' })),
    (tr, r) => {
      const c = tr.children;
      setText(c[0], r.name);
      const modes = [];
      if (r.limit > 0 || r.adaptive) modes.push(r.adaptive ? 'adaptive' : 'fixed');
      if (r.breaker) modes.push('breaker');
      if (r.shadow) modes.push('shadow');
      setText(c[1], modes.join(' · ') || '–');
      if (r.limit > 0) {
        const share = Math.min(1, r.in_flight / r.limit);
        // Width through the CSSOM: the page's CSP forbids style attributes.
        const bar = h('span', { class: share >= 1 ? 'bar full' : 'bar' });
        bar.style.width = `${Math.round(40 * share)}px`;
        c[2].replaceChildren(`${fmt.count(r.in_flight)} / ${fmt.count(r.limit)}`, bar);
      } else {
        c[2].replaceChildren(`${fmt.count(r.in_flight)} / –`);
      }
      setText(c[3], r.adaptive && r.base_rtt_ms > 0 ? fmt.ms(r.base_rtt_ms) : '–');
      setText(c[4], fmt.count(sumOf(r.admitted)));
      const shed = r.shed || {};
      setText(c[5], PRIOS.map((p) => fmt.count(shed[p] || 0)).join(' / '));
      c[5].classList.toggle('shed', sumOf(shed) > 0);
      c[6].dataset.state = r.breaker || '';
      setText(c[6], r.breaker ? `${r.breaker.replace('_', '-')} · ${fmt.counted(r.transitions || 0, 'transition', 'transitions')}` : '–');
      setText(c[7], r.breaker ? fmt.count(r.circuit_open || 0) : '–');
    });
}
