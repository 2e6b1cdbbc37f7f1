// weir dashboard: polls GET v1/dashboard/snapshot every second and renders it.
// No framework and no build step; the DOM is updated in place so focus and
// selections survive each refresh.

import { DecisionsChart } from './chart.js';
import { h, replace, setText, syncList } from './dom.js';
import { sparkline, draw as drawSpark } from './spark.js';
import * as fmt from './fmt.js';
import { renderProtect } from './protect.js';
import { renderOverrides } from './overrides.js';
import { renderSpend } from './spend.js';

const POLL_MS = 1000;
const TOKEN_KEY = 'weir.adminToken';
const MIN_WINDOW = 30; // points shown at least, so a fresh server's chart is not a sliver
const TOP_SHOWN = 3; // identities shown per rule in Top limited until "show all"

const $ = (id) => document.getElementById(id);

const state = {
  snap: null,
  offset: 0, // server clock minus local clock, ms
  updates: 0,
  scope: '',
  token: readToken(),
  gone: new Map(), // "rule\nidentity" -> local ms: unblocked here, hide until the server agrees
  timer: 0,
  inflight: false,
  again: false, // poll again at once (the token was just set, forgotten or refused)
  lastOk: 0,
  topOpen: new Set(), // rules whose Top limited list shows all the snapshot has
};

const chartCard = document.querySelector('[data-testid="decisions-chart"]');
const chart = new DecisionsChart($('chart'), $('chart-readout'), document.querySelectorAll('.series-toggle'));

// Tests and curious operators can look at what the page has.
window.weirDashboard = {
  get chart() { return chart.u; },
  get snapshot() { return state.snap; },
  get updates() { return state.updates; },
};

function readToken() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch { return ''; }
}
function writeToken(t) {
  state.token = t;
  try {
    if (t) sessionStorage.setItem(TOKEN_KEY, t);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch { /* storage disabled: keep it in memory only */ }
}

const serverNow = () => Date.now() + state.offset;

// ---------------------------------------------------------------- polling

async function poll() {
  clearTimeout(state.timer);
  if (state.inflight) return;
  state.inflight = true;
  const ctrl = new AbortController();
  const abort = setTimeout(() => ctrl.abort(), 4000);
  try {
    let snap;
    try {
      // With the admin token the snapshot shows identities; without it,
      // tags that hide them.
      const sent = state.token;
      const headers = sent ? { Authorization: `Bearer ${sent}` } : {};
      const r = await fetch('v1/dashboard/snapshot', { cache: 'no-store', signal: ctrl.signal, headers });
      if (sent && (r.status === 401 || r.status === 429)) {
        // Refused: forget the token and carry on read-only.
        const body = await r.json().catch(() => ({}));
        if (state.token === sent) writeToken('');
        renderAdmin();
        showAdminError(r.status === 401 ? 'The admin token was rejected. Enter it again.' : tooManyAttempts(r, body));
        state.again = true;
        return;
      }
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      snap = await r.json();
    } catch (e) {
      const since = state.lastOk ? ` · last update ${fmt.clock(state.lastOk)}` : '';
      setConn('error', `cannot reach weir (${e.name === 'AbortError' ? 'timeout' : e.message})${since}`);
      return;
    }
    state.lastOk = Date.now();
    if (snap.now_ms) state.offset = snap.now_ms - Date.now();
    pollEvents();
    try {
      render(snap);
      const outage = renderOutage(snap);
      setConn(outage ? 'degraded' : 'live', `${outage ? 'live · store outage' : 'live'} · ${fmt.clock(snap.now_ms || Date.now())}`);
    } catch (e) {
      console.error('weir dashboard: cannot draw the snapshot', e);
      setConn('error', `cannot draw the snapshot: ${e.message}`);
    }
  } finally {
    clearTimeout(abort);
    state.inflight = false;
    state.timer = setTimeout(poll, state.again ? 0 : POLL_MS);
    state.again = false;
  }
}

// The latest events (GET /v1/events, admin): read on from the last one
// seen, the newest 20 kept.
const events = { since: '', list: [], busy: false, token: '' };

async function pollEvents() {
  const token = state.token;
  if (token !== events.token) Object.assign(events, { since: '', list: [], token });
  if (!token || events.busy) {
    renderEvents();
    return;
  }
  events.busy = true;
  try {
    for (let i = 0; i < 12; i++) {
      const q = events.since ? `&since=${encodeURIComponent(events.since)}` : '';
      const r = await fetch(`v1/events?limit=1000${q}`, { cache: 'no-store', headers: { Authorization: `Bearer ${token}` } });
      if (!r.ok || token !== events.token) return;
      const body = await r.json();
      if (body.events.length) {
        events.list = events.list.concat(body.events).slice(-20);
        events.since = body.next;
      }
      if (body.events.length < 1000) break;
    }
  } catch { /* the next poll tries again */ } finally {
    events.busy = false;
    renderEvents();
  }
}

function renderEvents() {
  const locked = !events.token;
  $('events-locked').hidden = !locked;
  $('events-empty').hidden = locked || events.list.length > 0;
  const list = locked ? [] : events.list.slice().reverse();
  syncList($('events'), list, (e) => e.id, (e) => h('li', { 'data-kind': e.kind, 'data-identity': e.key },
    h('div', null,
      h('div', { class: 'who' }, e.key),
      h('div', { class: 'rule-tag' }, `rule ${e.rule}`)),
    h('div', { class: 'right' },
      h('div', null, e.kind === 'threshold' ? `${Math.round(e.threshold * 1000) / 10}% of the limit` : 'first refusal'),
      h('div', { class: 'until' }, fmt.clock(Date.parse(e.time))))), () => {});
}

/** refreshSoon polls now instead of waiting for the next tick. */
function refreshSoon() {
  if (!state.inflight) poll();
  else state.again = true;
}

function tooManyAttempts(r, body) {
  const after = Number(r.headers.get('Retry-After')) || 0;
  return body.detail && !after ? body.detail : `Too many failed token attempts from this address${after ? `: try again in ${fmt.countdown(after * 1000)}` : ''}.`;
}

/** redacted reports whether the snapshot hides identities behind tags. */
const redacted = (snap) => !!snap && snap.identities === 'redacted';

function setConn(s, text) {
  $('conn').dataset.state = s;
  setText($('conn-text'), text);
}

// ---------------------------------------------------------------- render

function render(snap) {
  state.snap = snap;
  state.updates++;
  const rules = snap.rules || [];
  const names = rules.map((r) => r.name);
  if (state.scope && !names.includes(state.scope)) state.scope = '';

  renderMeta(snap);
  renderKpis(snap);
  renderScopeOptions(names);
  renderChart(snap);
  renderRules(snap);
  renderTop(snap);
  renderBlocked(snap);
  renderStore(snap);
  renderFleet(snap);
  renderProtect(snap);
  renderOverrides(adminMode(snap) === 'token' ? state.token : '', names);
  renderSpend(adminMode(snap) === 'token' ? state.token : '', rules);
  renderTryRules(names);
}

// ---------------------------------------------------------------- outage

const FALLBACK = {
  allow: 'admitting every request (on_error: allow): nothing is limited',
  deny: 'refusing every request (on_error: deny)',
  local: 'each instance enforcing its share of every limit in memory (on_error: local)',
};

/**
 * renderOutage shows the banner at the top while the store fails: the
 * on_error fallback deciding and since when, or that the store does not
 * answer its health probe. It reports whether there is an outage.
 */
function renderOutage(snap) {
  const st = snap.store || {};
  const el = $('outage');
  const fb = st.fallback || '';
  const down = fb !== '' || st.healthy === false;
  el.hidden = !down;
  el.dataset.fallback = fb;
  if (!down) return false;
  const now = snap.now_ms || serverNow();
  const key = `${fb}|${st.fallback_since_ms || 0}|${Math.floor(now / 1000)}`;
  if (el.dataset.v === key) return true;
  el.dataset.v = key;
  const what = st.type === 'redis' ? 'Redis' : 'The store';
  if (fb) {
    const since = st.fallback_since_ms > 0
      ? [' since ', h('strong', null, fmt.clock(st.fallback_since_ms)), ` (${fmt.countdown(Math.max(1000, now - st.fallback_since_ms))})`]
      : [];
    replace($('outage-text'), h('strong', null, 'Store outage. '),
      `${what} is failing; weir is `, FALLBACK[fb] || `deciding by on_error: ${fb}`, ...since, '.');
  } else {
    replace($('outage-text'), h('strong', null, 'Store not answering. '),
      `${what} fails its health probe; decisions that need it fall back to their on_error policy.`);
  }
  return true;
}

function renderMeta(snap) {
  setText($('meta-instance'), snap.instance?.id ?? '–');
  setText($('meta-version'), snap.instance?.version ?? '–');
  const st = snap.store || {};
  setText($('meta-store'), st.type === 'redis' ? `redis · ${st.topology}` : (st.type || '–'));
}

function totals(series) {
  return {
    allowed: fmt.sum(series?.allowed),
    limited: fmt.sum(series?.limited),
    shadow: fmt.sum(series?.shadow_limited),
  };
}

/**
 * completeEnd returns how many of the series' points are complete seconds:
 * all of them, or all but the newest when it is the second in progress.
 */
function completeEnd(snap) {
  const series = snap.series || {};
  const n = (series.total?.allowed || []).length;
  const step = series.interval_ms || 1000;
  const start = series.start_ms || 0;
  const partial = n > 0 && snap.now_ms && start && start + n * step > snap.now_ms;
  return partial ? n - 1 : n;
}

function renderKpis(snap) {
  const tot = snap.series?.total || {};
  const t = totals(tot);
  const decided = t.allowed + t.limited + t.shadow;
  // Decisions per second: the average of the last 10 complete seconds.
  const end = completeEnd(snap);
  let recent = 0;
  let lim = 0;
  let k = 0;
  for (let i = Math.max(0, end - 10); i < end; i++, k++) {
    recent += (tot.allowed?.[i] || 0) + (tot.limited?.[i] || 0) + (tot.shadow_limited?.[i] || 0);
    lim += tot.limited?.[i] || 0;
  }
  setText($('kpi-rate'), fmt.rate(k ? recent / k : 0));
  setText($('kpi-rate-sub'), k ? `last 10 s · ${fmt.rate(lim / k)}/s limited` : 'waiting for data');
  setText($('kpi-allowed'), fmt.count(t.allowed));
  setText($('kpi-limited'), fmt.count(t.limited));
  setText($('kpi-limited-sub'), decided ? `${fmt.pct((100 * t.limited) / decided)} of decisions · 5 min` : 'last 5 min');
  setText($('kpi-shadow'), fmt.count(t.shadow));
  setText($('kpi-blocked'), fmt.count(visibleBlocked(snap).length));
  const inst = (snap.instances || []).length || 1;
  setText($('kpi-rules'), `${(snap.rules || []).length} · ${inst}`);
  setText($('kpi-rules-sub'), `rules in force · ${inst === 1 ? 'instance' : 'instances'}`);
}

// ---------------------------------------------------------------- chart

const scopeSel = $('chart-scope');
scopeSel.addEventListener('change', () => {
  state.scope = scopeSel.value;
  if (state.snap) {
    renderChart(state.snap);
    renderRules(state.snap);
  }
});

function renderScopeOptions(names) {
  syncOptions(scopeSel, [{ value: '', label: 'all rules (total)' }, ...names.map((n) => ({ value: n, label: `rule: ${n}` }))]);
  if (scopeSel.value !== state.scope) scopeSel.value = state.scope;
}

function syncOptions(sel, opts) {
  const cur = Array.from(sel.options).map((o) => o.value + '\u0000' + o.textContent).join('\n');
  const want = opts.map((o) => o.value + '\u0000' + o.label).join('\n');
  if (cur === want) return;
  const keep = sel.value;
  sel.replaceChildren(...opts.map((o) => h('option', { value: o.value, text: o.label })));
  if (opts.some((o) => o.value === keep)) sel.value = keep;
}

function renderChart(snap) {
  const series = snap.series || {};
  const tot = series.total || {};
  const n = (tot.allowed || []).length;
  const step = (series.interval_ms || 1000) / 1000;
  const start = (series.start_ms || (snap.now_ms || Date.now()) - n * 1000) / 1000;

  // A point for the second still in progress is left out rather than drawn
  // as a dip at the right edge. Of the complete seconds, the chart shows
  // those since the first decision in the window, and at least MIN_WINDOW,
  // so a fresh server is not drawn as a sliver.
  const end = completeEnd(snap);
  let first = end;
  for (let i = 0; i < end; i++) {
    if ((tot.allowed?.[i] || 0) + (tot.limited?.[i] || 0) + (tot.shadow_limited?.[i] || 0) > 0) { first = i; break; }
  }
  const withData = end - first;
  const from = Math.max(0, Math.min(first, end - MIN_WINDOW));

  const src = state.scope ? (series.rules?.[state.scope] || {}) : tot;
  const xs = [];
  const al = [];
  const li = [];
  const sh = [];
  for (let i = from; i < end; i++) {
    xs.push(start + i * step);
    al.push(src.allowed?.[i] ?? 0);
    li.push(src.limited?.[i] ?? 0);
    sh.push(src.shadow_limited?.[i] ?? 0);
  }
  chart.set([xs, al, li, sh]);

  const t = totals(tot);
  chartCard.dataset.points = String(withData);
  chartCard.dataset.shown = String(xs.length);
  chartCard.dataset.updates = String(state.updates);
  chartCard.dataset.total = String(t.allowed + t.limited + t.shadow);
  chartCard.dataset.lastMs = String(Math.round((start + (end - 1) * step) * 1000));
  const span = xs.length * step;
  setText($('chart-span'), span >= 295
    ? `${state.scope ? `rule ${state.scope}` : 'all rules'} · last 5 minutes`
    : `${state.scope ? `rule ${state.scope}` : 'all rules'} · last ${Math.round(span)} s`);
  $('chart-empty').hidden = withData > 0;
}

// ---------------------------------------------------------------- rules

function parseDuration(s) {
  if (!s) return 0;
  let total = 0;
  const re = /(\d+(?:\.\d+)?)(ms|h|m|s|d)/g;
  let m;
  while ((m = re.exec(s))) {
    const v = parseFloat(m[1]);
    total += v * { ms: 1, s: 1000, m: 60000, h: 3600000, d: 86400000 }[m[2]];
  }
  return total;
}

function ruleLatency(r) {
  return [r.latency_p50_ms, r.latency_p99_ms];
}

function renderRules(snap) {
  const rules = snap.rules || [];
  $('rules-empty').hidden = rules.length > 0;
  syncList($('rules-body'), rules, (r) => r.name, createRuleRow, (tr, r) => updateRuleRow(tr, r, snap));
}

function createRuleRow(r) {
  const chip = h('button', { type: 'button', class: 'chip', title: `Show rule ${r.name} in the chart` }, r.name);
  chip.addEventListener('click', () => {
    state.scope = state.scope === r.name ? '' : r.name;
    scopeSel.value = state.scope;
    if (state.snap) { renderChart(state.snap); renderRules(state.snap); }
  });
  const tr = h('tr', { 'data-rule': r.name },
    h('td', { class: 'rule-cell', 'data-label': 'Rule' }, chip),
    h('td', { class: 'match', 'data-label': 'Match' }),
    h('td', { class: 'ident', 'data-label': 'Identity' }),
    h('td', { class: 'limit', 'data-label': 'Limit' }),
    h('td', { class: 'algo', 'data-label': 'Algorithm' }),
    h('td', { class: 'mode', 'data-label': 'Mode' }),
    h('td', { class: 'num dec', 'data-label': 'Decisions (5 min)' }),
    h('td', { class: 'num pct', 'data-label': 'Limited' }),
    h('td', { class: 'num near', 'data-label': 'Near limit (5 min)' }),
    h('td', { class: 'num lat', 'data-label': 'Store p50 / p99' }),
    h('td', { class: 'spark-cell', 'data-label': 'Last 60 s' }, sparkline(`decisions per second for ${r.name}`)),
  );
  return tr;
}

function updateRuleRow(tr, r, snap) {
  const c = tr.children;
  const chip = c[0].firstChild;
  chip.setAttribute('aria-pressed', String(state.scope === r.name));
  tr.classList.toggle('selected', state.scope === r.name);
  setText(c[1], r.match || 'any request');
  c[1].title = r.match || '';
  setText(c[2], Array.isArray(r.identity) ? r.identity.join(' + ') : (r.identity || '–'));

  // Limit, with the penalty box and tiers under it.
  const tiers = r.tiers || [];
  const extra = [];
  if (r.block) extra.push(`block ${r.block}`);
  if (r.lease) extra.push(`lease ${r.lease}`);
  if (tiers.length) extra.push(`${tiers.length} tier${tiers.length > 1 ? 's' : ''}: ${tiers.map((t) => `${t.name} ${t.limit}`).join(', ')}`);
  const limitKey = `${r.limit}|${extra.join('|')}`;
  if (c[3].dataset.v !== limitKey) {
    c[3].dataset.v = limitKey;
    replace(c[3], r.limit || (tiers.length ? 'by tier' : '–'), ...extra.map((e) => h('small', null, e)));
  }
  const algos = new Set([r.algorithm, ...tiers.map((t) => t.algorithm)].filter(Boolean));
  setText(c[4], Array.from(algos).join(', ') || '–');

  const modeKey = r.shadow ? 'shadow' : 'enforce';
  if (c[5].dataset.v !== modeKey) {
    c[5].dataset.v = modeKey;
    c[5].replaceChildren(r.shadow
      ? h('span', { class: 'badge shadow', title: 'shadow mode: counts and reports, never rejects' }, 'shadow')
      : h('span', { class: 'badge enforce' }, 'enforce'));
  }
  setText(c[6], fmt.count(r.decisions));
  setText(c[7], fmt.pct(r.limited_pct));
  c[7].classList.toggle('hot', !r.shadow && r.limited_pct > 0);
  c[7].classList.toggle('shadowed', !!r.shadow && r.limited_pct > 0);
  // Admitted decisions that left their key past near_limit of the limit.
  const ratio = r.near_limit_ratio || 0;
  setText(c[8], ratio > 0 ? fmt.count(r.near_limit || 0) : 'off');
  c[8].title = ratio > 0
    ? `admitted decisions in the last 5 min that left their key at or past ${fmt.pct(ratio * 100)} of the limit`
    : 'near_limit is off for this rule';
  c[8].classList.toggle('warm', ratio > 0 && (r.near_limit || 0) > 0);
  const [p50, p99] = ruleLatency(r);
  setText(c[9], `${fmt.ms(p50)} / ${fmt.ms(p99)}`);

  const rs = snap.series?.rules?.[r.name];
  const limSrc = r.shadow ? rs?.shadow_limited : rs?.limited;
  const spark = r.spark || [];
  const lim = limSrc ? limSrc.slice(-spark.length || -60) : null;
  drawSpark(c[10].firstChild, spark, lim,
    `${r.name}: ${fmt.rate(spark.length ? fmt.sum(spark) / spark.length : 0)} decisions per second over the last minute`);
}

// ---------------------------------------------------------------- top limited

function renderTop(snap) {
  const top = snap.top || {};
  const order = (snap.rules || []).map((r) => r.name);
  for (const k of Object.keys(top)) if (!order.includes(k)) order.push(k);
  const groups = order.filter((k) => (top[k] || []).length > 0).map((k) => ({
    rule: k, all: top[k].length, items: state.topOpen.has(k) ? top[k] : top[k].slice(0, TOP_SHOWN),
  }));
  const blockedSet = new Set(visibleBlocked(snap).map((b) => b.rule + '\n' + b.identity));
  $('top-empty').hidden = groups.length > 0;
  syncList($('top'), groups, (g) => g.rule,
    (g) => {
      const more = h('button', { type: 'button', class: 'link more' });
      more.addEventListener('click', () => {
        if (state.topOpen.has(g.rule)) state.topOpen.delete(g.rule);
        else state.topOpen.add(g.rule);
        if (state.snap) renderTop(state.snap);
      });
      return h('div', { class: 'top-group', 'data-rule': g.rule }, h('h3', null, `rule ${g.rule}`), h('ol'), more);
    },
    (el, g) => {
      const more = el.querySelector('button.more');
      const open = state.topOpen.has(g.rule);
      more.hidden = g.all <= TOP_SHOWN;
      setText(more, open ? 'show fewer' : `show all ${fmt.count(g.all)}`);
      more.setAttribute('aria-expanded', String(open));
      const max = Math.max(1, ...g.items.map((i) => i.count));
      syncList(el.querySelector('ol'), g.items, (i) => i.identity,
        () => h('li', null,
          h('span', { class: 'id' }),
          h('span', { class: 'mark' }),
          h('span', { class: 'n' }),
          h('span', { class: 'bar', 'aria-hidden': 'true' }, h('span'))),
        (li, i) => {
          li.dataset.identity = i.identity;
          const isBlocked = blockedSet.has(g.rule + '\n' + i.identity);
          setText(li.querySelector('.id'), i.identity);
          li.querySelector('.id').title = i.identity;
          setText(li.querySelector('.mark'), isBlocked ? 'blocked' : '');
          li.querySelector('.bar span').style.transform = `scaleX(${(i.count / max).toFixed(4)})`;
          setText(li.querySelector('.n'), fmt.count(i.count));
        });
    });
}

// ---------------------------------------------------------------- penalty box

function visibleBlocked(snap) {
  const now = Date.now();
  for (const [k, t] of state.gone) if (now - t > 5000) state.gone.delete(k);
  return (snap.blocked || []).filter((b) => !state.gone.has(b.rule + '\n' + b.identity));
}

function adminMode(snap) {
  if (snap && snap.admin_enabled === false) return 'off';
  return state.token ? 'token' : 'readonly';
}

function renderAdmin() {
  const mode = adminMode(state.snap);
  const note = $('admin-note');
  $('token-form').hidden = mode !== 'readonly';
  $('admin-set').hidden = mode !== 'token';
  note.hidden = mode === 'token';
  document.body.dataset.identities = state.snap?.identities || '';
  const hidden = ' Identities are hidden: each shows as a tag (#…) that stays the same for the same identity.';
  if (mode === 'off') {
    note.replaceChildren(h('strong', null, 'Read-only.'), ' The admin API is off on this instance: start weir with ', h('code', null, 'WEIR_ADMIN_TOKEN'), ' set to see identities and unblock from here.', hidden);
  } else if (mode === 'readonly') {
    note.replaceChildren(h('strong', null, 'Read-only.'), ' Enter the admin token to see identities and unblock them; it is kept for this tab only.', hidden);
  }
}

function renderBlocked(snap) {
  renderAdmin();
  const list = visibleBlocked(snap).slice().sort((a, b) => b.blocked_until_ms - a.blocked_until_ms || a.identity.localeCompare(b.identity));
  const blocks = new Map((snap.rules || []).map((r) => [r.name, parseDuration(r.block)]));
  // A tag cannot be unblocked: wait for the snapshot that the token opens.
  const canAct = adminMode(snap) === 'token' && !redacted(snap);
  $('blocked-empty').hidden = list.length > 0;
  setText($('blocked-count'), list.length
    ? `${list.length} identit${list.length === 1 ? 'y' : 'ies'} rejected until the block runs out`
    : 'identities rejected until their block runs out');
  syncList($('blocked'), list, (b) => b.rule + '\n' + b.identity, createBlockedRow, (li, b) => {
    li.dataset.until = String(b.blocked_until_ms);
    li.dataset.span = String(blocks.get(b.rule) || 0);
    const btn = li.querySelector('button');
    btn.hidden = !canAct;
    tickRow(li, serverNow());
  });
}

function createBlockedRow(b) {
  const btn = h('button', { type: 'button', class: 'danger', 'aria-label': `Unblock ${b.identity} from rule ${b.rule}` }, 'Unblock');
  const li = h('li', { 'data-rule': b.rule, 'data-identity': b.identity },
    h('div', null,
      h('div', { class: 'who' }, b.identity),
      h('div', { class: 'rule-tag' }, `rule ${b.rule}`)),
    h('div', { class: 'right' },
      h('div', { class: 'timer' },
        h('div', { class: 'count', role: 'timer', 'aria-label': `time left for ${b.identity}` }),
        h('div', { class: 'until' })),
      btn),
    h('div', { class: 'bar', 'aria-hidden': 'true' }, h('span')));
  btn.addEventListener('click', () => confirmUnblock(b.rule, b.identity, li, btn));
  return li;
}

function tickRow(li, now) {
  const until = Number(li.dataset.until);
  const left = until - now;
  setText(li.querySelector('.count'), fmt.countdown(left));
  setText(li.querySelector('.until'), left > 0 ? `until ${fmt.clock(until)}` : 'block over');
  li.classList.toggle('leaving', left <= 0);
  const span = Number(li.dataset.span);
  const frac = span > 0 ? Math.max(0, Math.min(1, left / span)) : (left > 0 ? 1 : 0);
  li.querySelector('.bar span').style.transform = `scaleX(${frac.toFixed(4)})`;
}

setInterval(() => {
  const now = serverNow();
  for (const li of $('blocked').children) tickRow(li, now);
}, 250);

// Unblocking asks first, in a dialog of the page's own.
const confirmDlg = $('confirm-unblock');
let pending = null;

function confirmUnblock(rule, identity, li, btn) {
  pending = { rule, identity, li, btn };
  setText($('confirm-who'), identity);
  setText($('confirm-rule'), rule);
  confirmDlg.showModal();
  $('confirm-cancel').focus();
}

confirmDlg.addEventListener('close', () => {
  const p = pending;
  pending = null;
  if (!p) return;
  if (confirmDlg.returnValue === 'unblock') unblock(p.rule, p.identity, p.li, p.btn);
  else p.btn.focus();
});

async function unblock(rule, identity, li, btn) {
  const err = $('admin-error');
  err.hidden = true;
  btn.disabled = true;
  li.classList.add('leaving');
  try {
    const r = await fetch(`v1/blocked?rule=${encodeURIComponent(rule)}&key=${encodeURIComponent(identity)}`, {
      method: 'DELETE',
      headers: { Authorization: `Bearer ${state.token}` },
    });
    if (r.ok) {
      state.gone.set(rule + '\n' + identity, Date.now());
      // Keep keyboard users in the list: focus the next Unblock button, or the heading.
      const next = li.nextElementSibling || li.previousElementSibling;
      li.remove();
      (next?.querySelector('button:not([hidden])') || $('blocked-title')).focus?.();
      $('admin-note').hidden = true;
      if (state.snap) { renderKpis(state.snap); renderTop(state.snap); }
      $('blocked-empty').hidden = $('blocked').children.length > 0;
      announce(`Unblocked ${identity} from rule ${rule}.`);
      refreshSoon();
      return;
    }
    const body = await r.json().catch(() => ({}));
    if (r.status === 401 || r.status === 403) {
      writeToken('');
      renderAdmin();
      showAdminError('The admin token was rejected. Enter it again.');
      $('token-input').focus();
    } else {
      showAdminError(`Unblock failed: ${body.error || body.message || `HTTP ${r.status}`}`);
    }
  } catch (e) {
    showAdminError(`Unblock failed: ${e.message}`);
  }
  btn.disabled = false;
  li.classList.remove('leaving');
}

function showAdminError(text) {
  const err = $('admin-error');
  err.textContent = text;
  err.hidden = false;
}

function announce(text) {
  const el = $('admin-set');
  if (!el.hidden) {
    let live = el.querySelector('.live');
    if (!live) {
      live = h('span', { class: 'live', role: 'status' });
      el.prepend(live);
    }
    live.textContent = text + ' ';
    clearTimeout(announce.timer);
    announce.timer = setTimeout(() => live.remove(), 8000);
  }
}

$('blocked-title').tabIndex = -1;

$('token-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const input = $('token-input');
  const token = input.value.trim();
  if (!token) return;
  $('admin-error').hidden = true;
  // Check the token against the admin API once; a network problem is not a
  // verdict, so only an explicit 401/403 rejects it.
  try {
    const r = await fetch('v1/blocked', { headers: { Authorization: `Bearer ${token}` }, cache: 'no-store' });
    if (r.status === 401 || r.status === 403) {
      showAdminError('That token was rejected by the admin API.');
      input.select();
      return;
    }
    if (r.status === 429) {
      showAdminError(tooManyAttempts(r, await r.json().catch(() => ({}))));
      input.select();
      return;
    }
  } catch { /* keep the token; the next Unblock will tell */ }
  input.value = '';
  writeToken(token);
  if (state.snap) renderBlocked(state.snap); else renderAdmin();
  $('token-forget').focus();
  refreshSoon(); // the identities, at once
});

$('token-forget').addEventListener('click', () => {
  writeToken('');
  $('admin-set').querySelector('.live')?.remove();
  if (state.snap) renderBlocked(state.snap); else renderAdmin();
  $('token-input').focus();
  refreshSoon(); // back to tags
});

// ---------------------------------------------------------------- store

const BREAKER = {
  closed: 'breaker closed · store answering',
  half_open: 'breaker half-open · probing the store',
  open: 'breaker open · calls short-circuited',
};

function renderStore(snap) {
  const st = snap.store || {};
  const br = $('breaker');
  const bstate = st.breaker || 'unknown';
  br.dataset.state = st.healthy === false && bstate === 'closed' ? 'half_open' : bstate;
  let text = BREAKER[bstate] || `breaker ${bstate}`;
  if (st.healthy === false && bstate === 'closed') text = 'breaker closed · store unhealthy';
  setText($('breaker-text'), text);

  setText($('store-type'), st.type === 'memory' ? 'in-memory' : (st.type || '–'));
  setText($('store-topology'), st.topology === 'memory' ? 'single process' : (st.topology || '–'));
  const nodes = st.nodes || [];
  const nodesKey = nodes.join(',') + '|' + st.type + '|' + snap.identities;
  const nd = $('store-nodes');
  if (nd.dataset.v !== nodesKey) {
    nd.dataset.v = nodesKey;
    nd.replaceChildren(nodes.length
      ? h('ul', { class: 'nodes' }, nodes.map((n) => h('li', null, n)))
      : (st.type === 'memory' ? 'this process (state is not shared)'
        : snap.identities === 'redacted' ? 'shown with the admin token' : '–'));
  }
  setText($('store-p50'), fmt.ms(st.latency_p50_ms));
  setText($('store-p99'), fmt.ms(st.latency_p99_ms));
  setText($('store-errors'), fmt.count(st.errors_total ?? 0));
  $('store-errors').classList.toggle('bad', (st.errors_total || 0) > 0);
  const fb = $('store-fallback');
  setText(fb, st.fallback ? `${st.fallback} (in use)` : 'none in use');
  fb.classList.toggle('warn', !!st.fallback);
  // Decisions the fallback made are drawn with the others, as allowed or
  // limited; here is how many, since start and over the series.
  const recent = (snap.series?.total?.fallback || []).reduce((a, b) => a + b, 0);
  const fd = $('store-fallback-decisions');
  setText(fd, `${fmt.count(st.fallback_decisions_total ?? 0)} · ${fmt.count(recent)} in 5 min`);
  setText($('store-instances'), st.instances ? fmt.count(st.instances) : '–');
  const ls = st.leases || {};
  setText($('store-leases'), ls.taken ? `${fmt.count(ls.spent)} of ${fmt.count(ls.taken)} spent · ${fmt.count(ls.lapsed)} lapsed · ${fmt.counted(ls.calls, 'call', 'calls')}` : 'none');
  fd.classList.toggle('warn', recent > 0);
  renderDenyCache(st.deny_cache);
}

// The deny cache's hit ratio over the last refresh (its counters are
// cumulative), or since start on the first.
let denyPrev = null;
function renderDenyCache(dc) {
  const el = $('store-deny-cache');
  if (!dc) {
    setText(el, 'off');
    el.classList.remove('warn');
    return;
  }
  let hits = dc.hits_total || 0;
  let misses = dc.misses_total || 0;
  if (denyPrev && hits >= denyPrev.hits && misses >= denyPrev.misses) {
    [hits, misses] = [hits - denyPrev.hits, misses - denyPrev.misses];
  }
  denyPrev = { hits: dc.hits_total || 0, misses: dc.misses_total || 0 };
  const ratio = hits + misses > 0 ? `${fmt.pct(100 * hits / (hits + misses))} hits` : 'no traffic';
  const state = dc.live ? '' : ' · bypassed (channel down)';
  setText(el, `${ratio} · ${fmt.counted(dc.entries || 0, 'entry', 'entries')}${state}`);
  el.classList.toggle('warn', !dc.live);
}

// ---------------------------------------------------------------- fleet

function renderFleet(snap) {
  const self = snap.instance?.id;
  let inst = (snap.instances || []).slice();
  if (!inst.length && self) inst = [{ id: self, last_seen_ms: snap.now_ms }];
  inst.sort((a, b) => (a.id === self ? -1 : b.id === self ? 1 : a.id.localeCompare(b.id)));
  $('fleet-empty').hidden = inst.length > 0;
  const redis = snap.store?.type === 'redis';
  setText($('fleet-note'), (inst.length <= 1
    ? (redis ? 'one instance on this Redis: this one' : 'one instance: this one (in-memory store)')
    : `${inst.length} instances sharing this Redis`) + ' · decisions per second');
  const now = snap.now_ms || serverNow();
  syncList($('fleet-body'), inst, (i) => i.id,
    () => h('tr', null,
      h('td', { class: 'inst' }), h('td', { class: 'num seen' }),
      h('td', { class: 'num' }), h('td', { class: 'num' }), h('td', { class: 'num' })),
    (tr, i) => {
      const c = tr.children;
      const key = i.id + (i.id === self ? '\u0000self' : '');
      if (c[0].dataset.v !== key) {
        c[0].dataset.v = key;
        replace(c[0], i.id, i.id === self ? h('span', { class: 'self' }, 'this') : null);
      }
      const age = now - (i.last_seen_ms || now);
      setText(c[1], fmt.ago(age));
      c[1].classList.toggle('stale', age > 5000);
      setText(c[2], fmt.rate(i.allowed_per_s ?? 0));
      setText(c[3], fmt.rate(i.limited_per_s ?? 0));
      setText(c[4], fmt.rate(i.shadow_limited_per_s ?? 0));
      c[3].classList.toggle('lim', (i.limited_per_s || 0) > 0);
      c[4].classList.toggle('sh', (i.shadow_limited_per_s || 0) > 0);
    });
}

// ---------------------------------------------------------------- try it

const tryRule = $('try-rule');

function renderTryRules(names) {
  syncOptions(tryRule, names.map((n) => ({ value: n, label: n })));
}

async function sendCheck(rule, key, hits) {
  const r = await fetch('v1/check', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ rule, key, hits }),
    cache: 'no-store',
  });
  const text = await r.text();
  let body;
  try { body = JSON.parse(text); } catch { body = text; }
  return { status: r.status, headers: r.headers, body };
}

const HEADERS = ['RateLimit-Policy', 'RateLimit', 'Retry-After', 'X-RateLimit-Limit', 'X-RateLimit-Remaining', 'X-RateLimit-Reset'];

function showResult(res, prefix) {
  const b = res.body && typeof res.body === 'object' ? res.body : {};
  const summary = $('try-summary');
  const parts = [];
  if (prefix) parts.push(prefix);
  // A refusal is 429 with the decision in the body (allowed false).
  if ((res.status >= 400 && res.status !== 429) || typeof b.allowed !== 'boolean') {
    parts.push(h('span', { class: 'verdict err' }, `Error ${res.status}`),
      typeof res.body === 'string' ? res.body : (b.detail || b.error || b.message || 'unexpected answer'));
  } else if (b.allowed) {
    // A budget rule counts micro-units of its currency: show money.
    const cur = ((state.snap && state.snap.rules) || []).find((r) => r.name === b.rule)?.currency;
    const left = cur ? `${fmt.money(b.remaining)} of ${fmt.money(b.limit, cur)}` : `${fmt.count(b.remaining)} of ${fmt.count(b.limit)}`;
    parts.push(h('span', { class: 'verdict ok' }, 'Allowed'),
      h('strong', { class: 'left', 'data-currency': cur || '' }, left), ' left',
      b.reset_after_ms > 0 ? ` · full again in ${fmt.countdown(b.reset_after_ms)}` : '');
  } else {
    const until = typeof b.blocked_until === 'number' && b.blocked_until > 0 ? b.blocked_until
      : (typeof b.blocked_until === 'string' && b.blocked_until ? Date.parse(b.blocked_until) : 0);
    parts.push(h('span', { class: 'verdict no' }, 'Limited'),
      'retry in ', h('strong', null, fmt.countdown(b.retry_after_ms)),
      until > 0 ? ` · in the penalty box until ${fmt.clock(until)}` : '');
  }
  replace(summary, ...parts);

  const dl = $('try-headers');
  const rows = [h('dt', null, 'HTTP'), h('dd', null, String(res.status))];
  for (const name of HEADERS) {
    const v = res.headers.get(name);
    if (v != null) rows.push(h('dt', null, name), h('dd', null, v));
  }
  if (rows.length === 2) rows.push(h('dt', null, 'headers'), h('dd', null, 'no rate-limit headers in the answer'));
  dl.replaceChildren(...rows);
  setText($('try-json'), typeof res.body === 'string' ? res.body : JSON.stringify(res.body, null, 2));
  $('try-detail').hidden = false;
}

function tryInputs() {
  const rule = tryRule.value;
  const key = $('try-key').value.trim();
  const hits = Number($('try-hits').value);
  if (!rule || !key) return null;
  return { rule, key, hits: Number.isFinite(hits) ? hits : 1 };
}

async function runTry(times) {
  const form = $('try-form');
  if (!form.reportValidity()) return;
  const inp = tryInputs();
  if (!inp) return;
  const buttons = form.querySelectorAll('button');
  buttons.forEach((b) => { b.disabled = true; });
  try {
    let last;
    let ok = 0;
    for (let i = 0; i < times; i++) {
      last = await sendCheck(inp.rule, inp.key, inp.hits);
      if (last.body?.allowed) ok++;
      if (last.status >= 400 && last.status !== 429) break;
    }
    const decided = last.status < 400 || last.status === 429;
    const prefix = times > 1 && decided ? `${times} checks: ${ok} allowed, ${times - ok} limited. Last: ` : '';
    showResult(last, prefix);
  } catch (e) {
    $('try-summary').replaceChildren(h('span', { class: 'verdict err' }, 'Failed'), e.message);
  } finally {
    buttons.forEach((b) => { b.disabled = false; });
    refreshSoon();
  }
}

$('try-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  runTry(1);
});
$('try-burst').addEventListener('click', () => runTry(10));

// ---------------------------------------------------------------- start

renderAdmin();
poll();
