#!/usr/bin/env python3
"""A weir client in Python's standard library: ask POST /v1/check whether a
request may proceed.

weir answers 200 with the decision when it allows and 429 with the same
decision (allowed false) when it refuses; the body's "allowed" is the
answer either way. When weir cannot answer in time (timeout, connection
refused, a 5xx), the caller chooses: fail open (allow, and warn) or fail
closed (refuse). A 4xx other than 429 is the caller's mistake (an unknown
rule, a bad field) and raises WeirError whatever the choice.

As a program:
    weir_client.py --url http://localhost:8080 --rule api --key KEY
                   [--hits N] [--timeout SECONDS] [--fail-closed]
prints "allowed remaining=N" (exit 0), "limited retry_after_ms=N" (exit 1),
"refused (weir unavailable, failing closed)" (exit 1) or an error (exit 2).
"""

import argparse
import json
import sys
import urllib.error
import urllib.request


class WeirError(Exception):
    """weir refused the request itself: a 4xx other than 429."""


def check(base_url, rule, key, hits=1, timeout=0.25, fail_open=True):
    """Return weir's decision for one request, a dict with "allowed".

    timeout bounds the connection and each read, in seconds. On timeout or
    when weir is unavailable, returns {"allowed": fail_open,
    "unavailable": reason} instead of raising.
    """
    body = json.dumps({"rule": rule, "key": key, "hits": hits}).encode()
    req = urllib.request.Request(
        base_url.rstrip("/") + "/v1/check", data=body, method="POST",
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:
        payload = e.read()
        if e.code == 429:
            return json.loads(payload)  # the decision, allowed false
        if e.code < 500:
            try:
                err = json.loads(payload)
                raise WeirError("%s: %s" % (err.get("error"), err.get("detail"))) from None
            except ValueError:
                raise WeirError("HTTP %d" % e.code) from None
        reason = "HTTP %d" % e.code
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = str(getattr(e, "reason", e))
    return {"allowed": fail_open, "unavailable": reason}


def main(argv=None):
    p = argparse.ArgumentParser(description="Ask weir whether a request may proceed.")
    p.add_argument("--url", default="http://localhost:8080")
    p.add_argument("--rule", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--hits", type=int, default=1)
    p.add_argument("--timeout", type=float, default=0.25, help="seconds (default 0.25)")
    p.add_argument("--fail-closed", action="store_true",
                   help="refuse when weir is unavailable (default: allow)")
    a = p.parse_args(argv)
    try:
        d = check(a.url, a.rule, a.key, a.hits, a.timeout, not a.fail_closed)
    except WeirError as e:
        print("weir: %s" % e, file=sys.stderr)
        return 2
    if "unavailable" in d:
        mode = "failing open" if d["allowed"] else "failing closed"
        print("weir: unavailable (%s); %s" % (d["unavailable"], mode), file=sys.stderr)
        print("allowed (weir unavailable, failing open)" if d["allowed"]
              else "refused (weir unavailable, failing closed)")
        return 0 if d["allowed"] else 1
    if d["allowed"]:
        print("allowed remaining=%d" % d["remaining"])
        return 0
    print("limited retry_after_ms=%d" % d["retry_after_ms"])
    return 1


if __name__ == "__main__":
    sys.exit(main())
