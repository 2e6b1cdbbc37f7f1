#!/usr/bin/env bash
# Builds weir's container image (deploy/image/Dockerfile) from a static
# linux binary for this machine's architecture, built with the release
# settings of scripts/release.sh. The context holds the binary, passwd and
# group; FROM scratch, so the build pulls nothing.
#
#   scripts/image.sh                   # weir:<version> and weir:latest
#   IMAGE=weir:test scripts/image.sh   # that tag only
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
arch=$("$GO" env GOARCH)
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT

DIST="$ctx/dist" PLATFORMS="linux/$arch" GO="$GO" ./scripts/release.sh >/dev/null
mv "$ctx/dist/weir_linux_$arch" "$ctx/weir"
rm -rf "$ctx/dist"
cp deploy/image/Dockerfile deploy/image/passwd deploy/image/group "$ctx/"
chmod 0755 "$ctx/weir"
chmod 0644 "$ctx/passwd" "$ctx/group"
# /bin/ratelimit -> /weir: run under envoyproxy/ratelimit's name (as Envoy
# Gateway's Deployment does), weir serves in its stead (docs/envoy.md). A
# tar, because ADD keeps the symbolic link that COPY would follow.
mkdir -p "$ctx/links/bin"
ln -s /weir "$ctx/links/bin/ratelimit"
tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$ctx/links" -cf "$ctx/ratelimit.tar" bin
rm -rf "$ctx/links"

# The version the binary reports (weir version's first line), made a valid tag.
version=$("$GO" version -m "$ctx/weir" | awk '$1 == "mod" { print $3; exit }')
[ -n "$version" ] && [ "$version" != "(devel)" ] || version=devel
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
created=$(git log -1 --format=%cI 2>/dev/null || echo 1970-01-01T00:00:00Z)
tag=$(printf '%s' "$version" | tr -c 'A-Za-z0-9_.-' '-')

names=("${IMAGE:-weir:$tag}")
[ -n "${IMAGE:-}" ] || names+=(weir:latest)
tags=()
for n in "${names[@]}"; do tags+=(-t "$n"); done
docker build -q "${tags[@]}" \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" --build-arg CREATED="$created" \
  "$ctx" >/dev/null
echo "image: built ${names[*]} (weir $version, revision $revision)"
