#!/bin/bash
# The image built from source as docs/operating/deployment.md documents it: its "container-test: build"
# block run as written (podman build of the top-level Dockerfile, chargeguard compiled in the builder stage,
# then `podman run --rm chargeguard --version`) from SOURCE_ROOT, with what a machine without a registry
# needs added to `podman build` only: the local base (--build-arg BASE), the labels' version and source, and
# a compiler cache under CACHE (-v …:/ccache; empty on a fresh machine, so it changes nothing there).
# run.sh runs it (the container test's default), or ci/test starts it early in the background and the
# container test then checks its result (CHARGEGUARD_CONTAINER_IMAGE_DIR=OUT_DIR).
#
# usage: build-source.sh SOURCE_ROOT OUT_DIR [CACHE]
# Leaves in OUT_DIR: build.log (the block's whole output, the version line last), revision (the commit
# passed to the build), image (the built image's id, also tagged localhost/chargeguard:from-source) and
# status: "ok", "fail: …" or "skip: …" (exit 0, 1, 77).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$1" && pwd)
mkdir -p "$2" && out=$(cd "$2" && pwd)
mkdir -p "${3:-$out}/ccache" && cache=$(cd "${3:-$out}" && pwd)
rm -f "$out/status" "$out/revision" "$out/image" "$out/build.log"

skip() {
  echo "skip: $*" >"$out/status"
  echo "skipped: $*"
  exit 77
}
fail() {
  echo "fail: $*" >"$out/status"
  echo "FAIL: $*" >&2
  exit 1
}
# shellcheck source=tests/container/lib.sh
source "$here/lib.sh"

work=$(mktemp -d /tmp/cg-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
ensure_tools
use_containers_conf "$work"
ensure_base "$cache" "$work"

doc_tag=localhost/chargeguard:latest
version=$(sed -n "s/^ *version : '\([^']*\)'.*/\1/p" "$src/meson.build" | head -1)
revision=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
echo "$revision" >"$out/revision"
doc_block_in "$src/docs/operating/deployment.md" build >"$work/doc-build.sh" || fail "no 'build' block in deployment.md"
# podman as the block calls it, plus the local base, the labels and the compiler cache on `podman build`.
{
  echo 'podman() {'
  echo '  if [ "$1" = build ]; then'
  echo '    shift'
  printf '    command podman build --build-arg BASE=%q --build-arg VERSION=%q --build-arg SOURCE=file://chargeguard -v %q "$@"\n' \
    "$base" "$version" "$cache/ccache:/ccache"
  echo '  else'
  echo '    command podman "$@"'
  echo '  fi'
  echo '}'
} >"$work/podman-wrap.sh"
step "the documented build (podman build of the Dockerfile, chargeguard compiled in the builder stage)"
t0=$(date +%s)
(cd "$src" && bash -euo pipefail -c "source '$work/podman-wrap.sh'; source '$work/doc-build.sh'") \
  >"$out/build.log" 2>&1 || {
  tail -40 "$out/build.log"
  fail "the documented podman build (build.log in $out)"
}
step "built in $(($(date +%s) - t0)) s"
id=$(podman image inspect --format '{{.Id}}' "$doc_tag") || fail "the build left no $doc_tag"
podman tag "$id" localhost/chargeguard:from-source && podman untag "$id" "$doc_tag" >/dev/null 2>&1
echo "$id" >"$out/image"
grep '^chargeguard ' "$out/build.log" | tail -1
echo ok >"$out/status"
