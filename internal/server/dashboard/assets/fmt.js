// Number, time and duration formatting for the dashboard.

const intFmt = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const oneFmt = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });
const compactFmt = new Intl.NumberFormat(undefined, { notation: 'compact', maximumFractionDigits: 1 });
const timeFmt = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23' });

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
  if (p < 0.1) return '<0.1%';
  if (p < 10) return oneFmt.format(p) + '%';
  return intFmt.format(p) + '%';
}

/** ms formats a latency in milliseconds: 35 µs, 0.21 ms, 1.4 ms, 12 ms; 0 means no data yet. */
export function ms(v) {
  if (v == null || !Number.isFinite(v) || v <= 0) return '–';
  if (v < 0.1) return Math.max(1, Math.round(v * 1000)) + ' µs';
  if (v < 10) return v.toFixed(v < 1 ? 2 : 1) + ' ms';
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
