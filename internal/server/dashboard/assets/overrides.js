// The Overrides card: with the admin token, the overrides of every rule
// (GET v1/overrides?rule=) and the latest changes of their audit log
// (GET v1/overrides/audit), read every few seconds, apart from the
// snapshot: both are admin data.

import { h, replace, setText } from './dom.js';

const EVERY_MS = 5000;
const SHOWN = 20; // overrides shown per rule
const CHANGES = 10; // audit entries shown

const $ = (id) => document.getElementById(id);

const st = { at: 0, token: '', busy: false };

async function getJSON(url, token) {
  const r = await fetch(url, { cache: 'no-store', headers: { Authorization: `Bearer ${token}` } });
  if (!r.ok) throw new Error(`HTTP ${r.status}`);
  return r.json();
}

/**
 * renderOverrides refreshes the card from the admin API when the token is
 * set and the last read is older than EVERY_MS (or the token changed).
 * token is the admin token ('' for none); rules, the rule names in force.
 */
export function renderOverrides(token, rules) {
  const body = $('overrides-body');
  const note = $('overrides-note');
  if (!token) {
    body.hidden = true;
    note.hidden = false;
    st.token = '';
    return;
  }
  if (st.busy || (st.token === token && Date.now() - st.at < EVERY_MS)) return;
  st.busy = true;
  st.token = token;
  load(token, rules).finally(() => { st.busy = false; st.at = Date.now(); });
}

async function load(token, rules) {
  const body = $('overrides-body');
  const note = $('overrides-note');
  try {
    const [lists, audit] = await Promise.all([
      Promise.all(rules.map((r) => getJSON(`v1/overrides?rule=${encodeURIComponent(r)}`, token))),
      getJSON(`v1/overrides/audit?limit=${CHANGES}`, token),
    ]);
    drawList(lists);
    drawAudit(audit.changes || []);
    $('overrides-error').hidden = true;
    note.hidden = true;
    body.hidden = false;
  } catch (e) {
    // A refused token is the snapshot poll's to report; say why here too.
    setText($('overrides-error'), `Cannot read the overrides: ${e.message}`);
    $('overrides-error').hidden = false;
  }
}

function drawList(lists) {
  const rows = [];
  let total = 0;
  for (const l of lists) {
    const os = l.overrides || [];
    total += os.length;
    for (const o of os.slice(0, SHOWN)) {
      rows.push(h('tr', { 'data-rule': o.rule, 'data-key': o.key },
        h('td', null, o.rule),
        h('td', { class: 'who' }, o.key),
        h('td', { class: 'limit' }, o.limit),
        h('td', null, o.until ? new Date(o.until).toLocaleString() : 'no end'),
        h('td', { class: 'note' }, o.note || '')));
    }
    if (os.length > SHOWN) {
      rows.push(h('tr', { class: 'more' }, h('td', { colspan: '5' }, `and ${os.length - SHOWN} more of rule ${l.rule}: weir override list --rule ${l.rule}`)));
    }
  }
  replace($('overrides-rows'), rows);
  $('overrides-table').hidden = total === 0;
  $('overrides-empty').hidden = total > 0;
  setText($('overrides-count'), total ? `${total} override${total === 1 ? '' : 's'} in force or not yet swept` : 'per-identity limits set through the admin API');
}

function drawAudit(changes) {
  const items = changes.slice().reverse().map((c) => h('li', { 'data-op': c.op, 'data-rule': c.rule, 'data-key': c.key, 'data-id': c.id },
    h('span', { class: 'when' }, new Date(c.time).toLocaleTimeString()),
    ' ',
    h('strong', null, c.op === 'set' ? 'set' : 'deleted'),
    ` ${c.rule ? c.rule + ' · ' : ''}${c.key} ${c.op === 'set' ? '→' : 'was'} ${c.limit}`,
    c.note ? h('span', { class: 'note' }, ` “${c.note}”`) : null));
  replace($('overrides-audit'), items);
  $('overrides-audit-empty').hidden = items.length > 0;
}
