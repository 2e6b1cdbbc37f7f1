// Number, time and duration formatting for the dashboard.

// Every number on the page goes through these: one locale's digits,
// grouping (1,234) and decimal mark everywhere.
const intFmt = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const oneFmt = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });
const fixedFmts = new Map();

/** fixed formats n with exactly digits decimals: fixed(0.2, 2) is 0.20. */
export function fixed(n, digits) {
  if (n == null || !Number.isFinite(n)) return '–';
  let f = fixedFmts.get(digits);
  if (!f) {
    f = new Intl.NumberFormat(undefined, { minimumFractionDigits: digits, maximumFractionDigits: digits });
    fixedFmts.set(digits, f);
  }
  return f.format(n);
}

/**
 * ticks formats an axis's tick values with the decimals their step needs:
 * 0, 2.5, 5, 7.5 … 12.5 (never 13), and 0, 5, 10 without any.
 */
export function ticks(vals) {
  let step = Infinity;
  for (let i = 1; i < vals.length; i++) {
    const d = Math.abs(vals[i] - vals[i - 1]);
    if (d > 0 && d < step) step = d;
  }
  let digits = 0;
  if (Number.isFinite(step)) {
    // The decimals that step shows exactly, at most 3.
    while (digits < 3 && Math.abs(Math.round(step * 10 ** digits) - step * 10 ** digits) > 1e-9 * 10 ** digits) digits++;
  }
  const big = vals.some((v) => Math.abs(v) >= 1e4);
  return vals.map((v) => (v == null ? '' : big ? compactFmt.format(v) : fixed(v, digits)));
}
const compactFmt = new Intl.NumberFormat(undefined, { notation: 'compact', maximumFractionDigits: 1 });
const timeFmt = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23' });

// The locale's decimal mark, for amounts written from whole micro-units.
const decimalMark = new Intl.NumberFormat(undefined).formatToParts(1.5).find((p) => p.type === 'decimal')?.value ?? '.';

/**
 * money formats micro-units (millionths) of a currency as an exact decimal
 * amount, with at least two and at most six decimals: money(1234567, 'USD')
 * is 1.234567 USD, money(25000000, 'EUR') 25.00 EUR. It never goes through
 * a float fraction, so no micro-unit is rounded away.
 */
export function money(micro, currency) {
  if (micro == null || !Number.isFinite(micro)) return '–';
  const m = Math.abs(Math.round(micro));
  let frac = String(m % 1e6).padStart(6, '0').replace(/0+$/, '');
  if (frac.length < 2) frac = frac.padEnd(2, '0');
  return `${micro < 0 ? '-' : ''}${intFmt.format(Math.floor(m / 1e6))}${decimalMark}${frac}${currency ? ` ${currency}` : ''}`;
}

/** count formats a whole number: 1,234 below a million, 1.2M above. */
export function count(n) {
  if (n == null || !Number.isFinite(n)) return '–';
  return Math.abs(n) >= 1e6 ? compactFmt.format(n) : intFmt.format(Math.round(n));
}

/** counted formats n things, the noun agreeing with n: 1 call, 2 calls. */
export function counted(n, one, many) {
  return `${count(n)} ${n === 1 ? one : many}`;
}

/** rate formats a per-second rate: 0, 0.4, 12, 1,234, 1.2M. */
export function rate(n) {
  if (n == null || !Number.isFinite(n)) return '–';
  if (n === 0) return '0';
  if (Math.abs(n) < 10) return oneFmt.format(n);
  return count(n);
}

/** pct formats a 0..100 percentage with a precision that fits its size. */
export function pct(p) {
  if (p == null || !Number.isFinite(p)) return '–';
  if (p === 0) return '0%';
  if (p < 0.1) return `<${oneFmt.format(0.1)}%`;
  if (p < 10) return oneFmt.format(p) + '%';
  return intFmt.format(p) + '%';
}

/** ms formats a latency in milliseconds: 35 µs, 0.21 ms, 1.4 ms, 12 ms; 0 means no data yet. */
export function ms(v) {
  if (v == null || !Number.isFinite(v) || v <= 0) return '–';
  if (v < 0.1) return intFmt.format(Math.max(1, Math.round(v * 1000))) + ' µs';
  if (v < 10) return fixed(v, v < 1 ? 2 : 1) + ' ms';
  return intFmt.format(v) + ' ms';
}

/** clock formats an epoch-millisecond instant as a local wall-clock time. */
export function clock(t) {
  return timeFmt.format(new Date(t));
}

/** countdown formats a remaining duration: 1h 02m, 14m 09s, 0:42. */
export function countdown(msLeft) {
  if (msLeft <= 0) return 'expired';
  const s = Math.ceil(msLeft / 1000);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = s % 60;
  if (h > 0) return `${h}h ${String(m).padStart(2, '0')}m ${String(sec).padStart(2, '0')}s`;
  if (m > 0) return `${m}m ${String(sec).padStart(2, '0')}s`;
  return `${sec}s`;
}

/** ago formats how long ago something happened, coarsely: now, 3s ago, 2m ago. */
export function ago(msAgo) {
  if (msAgo < 1500) return 'now';
  const s = Math.round(msAgo / 1000);
  if (s < 90) return `${s}s ago`;
  const m = Math.round(s / 60);
  if (m < 90) return `${m}m ago`;
  return `${Math.round(m / 60)}h ago`;
}

/** sum adds up an array of numbers, ignoring nulls. */
export function sum(a) {
  let t = 0;
  if (a) for (const v of a) if (v) t += v;
  return t;
}
