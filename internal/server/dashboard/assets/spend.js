// The Top spenders card: with the admin token, the heaviest identities of
// every budget rule (one rule per level of a hierarchy: key, user, team,
// organisation) in the rule's current period, in money, read from
// GET v1/spend?rule= every few seconds, apart from the snapshot: spend
// is admin data.

import { h, replace, setText } from './dom.js';
import * as fmt from './fmt.js';

const EVERY_MS = 5000;
const SHOWN = 5; // identities per level

const $ = (id) => document.getElementById(id);

const st = { at: 0, token: '', busy: false, rules: '' };

async function getJSON(url, token) {
  const r = await fetch(url, { cache: 'no-store', headers: { Authorization: `Bearer ${token}` } });
  if (!r.ok) throw new Error(`HTTP ${r.status}`);
  return r.json();
}

/**
 * renderSpend refreshes the card when the token is set and the last read
 * is older than EVERY_MS (or the token or the budget rules changed).
 * token is the admin token ('' for none); rules, the snapshot's rules.
 */
export function renderSpend(token, rules) {
  const budgets = rules.filter((r) => r.currency).map((r) => r.name);
  const card = $('spend-card');
  card.hidden = budgets.length === 0;
  if (budgets.length === 0) return;
  const note = $('spend-note');
  if (!token) {
    $('spend-body').hidden = true;
    note.hidden = false;
    st.token = '';
    return;
  }
  const key = budgets.join('\u0000');
  if (st.busy || (st.token === token && st.rules === key && Date.now() - st.at < EVERY_MS)) return;
  st.busy = true;
  st.token = token;
  st.rules = key;
  load(token, budgets).finally(() => { st.busy = false; st.at = Date.now(); });
}

async function load(token, budgets) {
  try {
    const lists = await Promise.all(budgets.map((r) => getJSON(`v1/spend?rule=${encodeURIComponent(r)}&n=${SHOWN}`, token)));
    draw(lists);
    $('spend-error').hidden = true;
    $('spend-note').hidden = true;
    $('spend-body').hidden = false;
  } catch (e) {
    setText($('spend-error'), `Cannot read the spend: ${e.message}`);
    $('spend-error').hidden = false;
  }
}

function period(p) {
  if (!p || !p.start) return '';
  const d = (s) => new Date(s).toLocaleDateString(undefined, { year: 'numeric', month: 'short', day: 'numeric' });
  return `${d(p.start)} – ${d(p.end)}`;
}

function draw(lists) {
  const groups = lists.map((l) => {
    const top = l.top || [];
    const items = top.map((e) => h('li', { 'data-identity': e.identity, 'data-micro': String(e.count) },
      h('span', { class: 'who' }, e.identity),
      h('span', { class: 'amount', title: e.error > 0 ? `at most ${fmt.money(e.error, l.currency)} over` : '' }, fmt.money(e.count, l.currency))));
    return h('div', { class: 'spend-group', 'data-rule': l.rule },
      h('h3', null, `rule ${l.rule}`, h('span', { class: 'when' }, ` ${period(l.period)}${l.scope === 'instance' ? ' · this instance' : ''}`)),
      items.length ? h('ol', null, ...items) : h('p', { class: 'empty' }, 'No spend settled in this period yet.'));
  });
  replace($('spend-levels'), groups);
}
