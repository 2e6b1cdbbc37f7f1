#!/usr/bin/env bash
# Cross-compiles weir's release binaries: static (CGO off), reproducible
# (-trimpath, no build ID that depends on the machine, the VCS stamp from
# the checkout), for each platform in PLATFORMS, into DIST with a
# SHA256SUMS file.
#
#   scripts/release.sh                 # dist/, the default platforms
#   DIST=out PLATFORMS=linux/amd64 scripts/release.sh
#   scripts/release.sh --check         # build linux/amd64 twice, in two
#                                      # build caches, and compare the bytes
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
DIST=${DIST:-dist}
PLATFORMS=${PLATFORMS:-"linux/amd64 linux/arm64 darwin/arm64"}

build() { # build OS ARCH OUT
  CGO_ENABLED=0 GOOS=$1 GOARCH=$2 GOFLAGS= "$GO" build -trimpath -buildvcs=true \
    -ldflags '-s -w -buildid=' -o "$3" ./cmd/weir
}

if [ "${1:-}" = "--check" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  build linux amd64 "$tmp/a"
  # The second build starts from an empty build cache, so that nothing of
  # the first is reused: equal bytes mean the build itself is reproducible.
  GOCACHE="$tmp/cache" build linux amd64 "$tmp/b"
  a=$(sha256sum "$tmp/a" | cut -d' ' -f1)
  b=$(sha256sum "$tmp/b" | cut -d' ' -f1)
  if [ "$a" != "$b" ]; then
    echo "release: two builds of linux/amd64 differ: $a and $b" >&2
    exit 1
  fi
  if ! "$GO" version -m "$tmp/a" | grep -q 'CGO_ENABLED=0'; then
    echo "release: the binary was not built with CGO_ENABLED=0" >&2
    exit 1
  fi
  if ! "$GO" version -m "$tmp/a" | grep -q 'vcs.revision='; then
    echo "release: the binary carries no VCS revision (build in a clone: a linked git worktree gets none)" >&2
    exit 1
  fi
  echo "release: two builds of linux/amd64 are byte-identical ($a), static, stamped with the VCS revision"
  exit 0
fi

mkdir -p "$DIST"
rm -f "$DIST"/weir_* "$DIST"/SHA256SUMS
for p in $PLATFORMS; do
  os=${p%/*} arch=${p#*/}
  out="$DIST/weir_${os}_${arch}"
  build "$os" "$arch" "$out"
  echo "built $out"
done
(cd "$DIST" && sha256sum weir_* > SHA256SUMS)
cat "$DIST/SHA256SUMS"
