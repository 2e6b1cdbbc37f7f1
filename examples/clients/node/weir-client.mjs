#!/usr/bin/env node
// A weir client for Node.js (18 or later): built-in fetch, no packages.
// It asks POST /v1/check whether a request may proceed.
//
// weir answers 200 with the decision when it allows and 429 with the same
// decision (allowed false) when it refuses; the body's `allowed` is the
// answer either way. When weir cannot answer in time (timeout, connection
// refused, a 5xx), the caller chooses: fail open (allow, and warn) or fail
// closed (refuse). A 4xx other than 429 is the caller's mistake (an
// unknown rule, a bad field) and throws WeirError whatever the choice.
//
// As a program:
//   node weir-client.mjs --url http://localhost:8080 --rule api --key KEY
//                        [--hits N] [--timeout-ms MS] [--fail-closed]
// prints "allowed remaining=N" (exit 0), "limited retry_after_ms=N"
// (exit 1), "refused (weir unavailable, failing closed)" (exit 1) or an
// error (exit 2).

import { parseArgs } from 'node:util';
import { pathToFileURL } from 'node:url';

/** weir refused the request itself: a 4xx other than 429. */
export class WeirError extends Error {}

/**
 * Returns weir's decision for one request, an object with `allowed`.
 * timeoutMs bounds the whole call. On timeout or when weir is unavailable
 * it returns { allowed: failOpen, unavailable: reason } instead of throwing.
 */
export async function check(baseURL, rule, key, { hits = 1, timeoutMs = 250, failOpen = true } = {}) {
  let reason;
  try {
    const res = await fetch(new URL('/v1/check', baseURL), {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ rule, key, hits }),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const body = await res.json().catch(() => null);
    if (res.ok || res.status === 429) {
      if (body && typeof body.allowed === 'boolean') return body;
      reason = `HTTP ${res.status} without a decision`;
    } else if (res.status < 500) {
      throw new WeirError(body ? `${body.error}: ${body.detail}` : `HTTP ${res.status}`);
    } else {
      reason = `HTTP ${res.status}`;
    }
  } catch (e) {
    if (e instanceof WeirError) throw e;
    reason = e.name === 'TimeoutError' ? `no answer within ${timeoutMs} ms` : (e.cause?.code || e.message);
  }
  return { allowed: failOpen, unavailable: reason };
}

async function main() {
  const { values: a } = parseArgs({
    options: {
      url: { type: 'string', default: 'http://localhost:8080' },
      rule: { type: 'string' },
      key: { type: 'string' },
      hits: { type: 'string', default: '1' },
      'timeout-ms': { type: 'string', default: '250' },
      'fail-closed': { type: 'boolean', default: false },
    },
  });
  if (!a.rule || !a.key) {
    console.error('usage: weir-client.mjs --rule RULE --key KEY [--url URL] [--hits N] [--timeout-ms MS] [--fail-closed]');
    return 2;
  }
  let d;
  try {
    d = await check(a.url, a.rule, a.key, {
      hits: Number(a.hits), timeoutMs: Number(a['timeout-ms']), failOpen: !a['fail-closed'],
    });
  } catch (e) {
    console.error(`weir: ${e.message}`);
    return 2;
  }
  if (d.unavailable) {
    console.error(`weir: unavailable (${d.unavailable}); ${d.allowed ? 'failing open' : 'failing closed'}`);
    console.log(d.allowed ? 'allowed (weir unavailable, failing open)' : 'refused (weir unavailable, failing closed)');
    return d.allowed ? 0 : 1;
  }
  if (d.allowed) {
    console.log(`allowed remaining=${d.remaining}`);
    return 0;
  }
  console.log(`limited retry_after_ms=${d.retry_after_ms}`);
  return 1;
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  process.exitCode = await main();
}
