#!/usr/bin/env bash
# Installs what `make test` needs when it is missing: Go tools from the Go
# module proxy and system packages from Debian. Safe to run repeatedly.
set -euo pipefail

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
# redis-py drives weir serve's Redis-protocol listener (internal/resp tests).
/usr/bin/python3 -c 'import redis' >/dev/null 2>&1 || need_apt+=(python3-redis)
# node-redis 4 (Debian's node-redis) drives it too, under node.
[ -d /usr/share/nodejs/redis ] || [ -d /usr/share/nodejs/@redis/client ] || need_apt+=(node-redis)
# The example clients (examples/clients) run under python3, node and curl.
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
# systemd-analyze checks deploy/systemd/weir.service (deploy/systemd_test.go).
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
for extra in ${WEIR_DEPS_EXTRA:-}; do
  case "$extra" in
    nginx) command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx) ;;
    caddy) command -v caddy >/dev/null 2>&1 || need_apt+=(caddy) ;;
    # promtool (make promtool-test) and the Prometheus end-to-end test.
    prometheus) command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus) ;;
    # The browser tests (the dashboard's, driven from Go with chromedp, and
    # replay's HTML report) run Debian's Chromium headless.
    chromium) [ -x /usr/bin/chromium ] || need_apt+=(chromium) ;;
  esac
done

if [ ${#need_apt[@]} -gt 0 ] && ! command -v apt-get >/dev/null 2>&1; then
  # Not a Debian-like system: say what is missing rather than fail later.
  echo "deps: missing ${need_apt[*]} (Debian package names), and there is no apt-get here." >&2
  echo "deps: install them with your package manager (redis-tools is redis-cli, python3-redis is the redis module" >&2
  echo "deps: for python3, nodejs is node, prometheus includes promtool) and run make test again." >&2
  exit 1
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "deps: installing ${need_apt[*]} from Debian's packages"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # A package install may start a system redis on 6379 (or Prometheus on
  # 9090); tests never use them.
fi

GOBIN="$(go env GOPATH)/bin"
if [ ! -x "$GOBIN/staticcheck" ]; then
  echo "deps: installing staticcheck"
  # 2026.2.2; the proxy knows it by its module version only
  go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
fi
