#!/usr/bin/env bash
# Builds the Compose demo's four images from this machine's own files, each
# FROM scratch: nothing is pulled or downloaded.
#
#   weir:TAG             scripts/image.sh (the release image)
#   weir-demo-redis:TAG  /usr/bin/redis-server and the shared libraries it loads
#   weir-demo-nginx:TAG  /usr/sbin/nginx, its shared libraries and nginx.conf here
#   weir-demo-app:TAG    deploy/compose/app, a static Go binary
#
# TAG is $WEIR_DEMO_TAG, else "demo" (compose.yaml reads the same variable).
# redis-server and nginx come from Debian's packages (scripts/deps.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
GO=${GO:-go}
TAG=${WEIR_DEMO_TAG:-demo}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The users the images run as (65532, as in weir's image).
passwd() {
  mkdir -p "$1/etc"
  cp deploy/image/passwd deploy/image/group "$1/etc/"
}

# with_libs BINARY ROOT PATH: copies BINARY to ROOT/PATH, and every shared
# library ldd lists for it (the dynamic loader too) to the same path under
# ROOT, so that the binary runs in an image with nothing else.
with_libs() {
  mkdir -p "$2$(dirname "$3")"
  cp -L "$1" "$2$3"
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | while read -r lib; do
    mkdir -p "$2$(dirname "$lib")"
    cp -L "$lib" "$2$lib"
  done
}

build() { # build NAME CONTEXT: the image NAME:TAG from CONTEXT's Dockerfile
  docker build -q -t "$1:$TAG" "$2" >/dev/null
  echo "compose: built $1:$TAG"
}

IMAGE="weir:$TAG" GO="$GO" ./scripts/image.sh

redis=$(command -v redis-server || echo /usr/bin/redis-server)
mkdir -p "$work/redis/root"
passwd "$work/redis/root"
with_libs "$redis" "$work/redis/root" /usr/bin/redis-server
cat > "$work/redis/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY root/ /
USER 65532:65532
EXPOSE 6379
ENTRYPOINT ["/usr/bin/redis-server"]
DOCKERFILE
build weir-demo-redis "$work/redis"

nginx=$(command -v nginx || echo /usr/sbin/nginx)
mkdir -p "$work/nginx/root/etc/nginx"
passwd "$work/nginx/root"
with_libs "$nginx" "$work/nginx/root" /usr/sbin/nginx
cp deploy/compose/nginx.conf "$work/nginx/root/etc/nginx/nginx.conf"
cat > "$work/nginx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY root/ /
USER 65532:65532
EXPOSE 8000
STOPSIGNAL SIGQUIT
ENTRYPOINT ["/usr/sbin/nginx", "-c", "/etc/nginx/nginx.conf", "-e", "stderr"]
DOCKERFILE
build weir-demo-nginx "$work/nginx"

mkdir -p "$work/app/root"
passwd "$work/app/root"
CGO_ENABLED=0 "$GO" build -trimpath -ldflags '-s -w' -o "$work/app/root/app" ./deploy/compose/app
cat > "$work/app/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY root/ /
USER 65532:65532
EXPOSE 3000
ENTRYPOINT ["/app"]
DOCKERFILE
build weir-demo-app "$work/app"
