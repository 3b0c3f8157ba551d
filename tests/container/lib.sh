# shellcheck shell=bash
# Sourced by run.sh and build-source.sh: the podman set-up these machines need
# (../../../shared/specs/containers.md) and the documented build. Each caller defines skip and fail.

step() { echo "== $(date -u +%T) $*"; }

# podman, runc, debootstrap and catatonit (the pod's infra process, a podman recommendation that
# --no-install-recommends leaves out); installed as root in CI (CI or CHARGEGUARD_CI set), else a skip.
ensure_tools() {
  have_tools() {
    command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null &&
      command -v catatonit >/dev/null
  }
  [ "$(id -u)" = 0 ] || skip "not root: rootful podman with runc is what works on these machines"
  if ! have_tools && [ -n "${CI:-}${CHARGEGUARD_CI:-}" ]; then
    step "installing podman runc debootstrap catatonit"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=300 \
      podman runc debootstrap catatonit >/dev/null || skip "apt-get install podman runc debootstrap failed"
  fi
  have_tools || skip "podman, runc, debootstrap or catatonit is not installed (CI installs them as root)"
}

# runc (crun refuses the hybrid cgroup layout) and lowered default ulimits, through CONTAINERS_CONF.
use_containers_conf() {  # DIR
  cat >"$1/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
EOF
  export CONTAINERS_CONF=$1/containers.conf
}

# The stand-in for debian:bookworm-slim where no registry is reachable: a debootstrapped minbase given what
# the published slim image has (debuerreotype's minimizing and slimming configuration): dpkg without fsync
# after each file, no documentation, manual pages or translations installed, apt without translation
# indexes. So `apt-get install` in the Dockerfile does here what it does on the real base, at its speed.
# The tarball is cached in CACHE; an older stand-in without that configuration is replaced.
base=localhost/debian:bookworm-slim
ensure_base() {  # CACHE WORK (after use_containers_conf)
  local tarball=$1/bookworm-slim-standin.tar work=$2
  podman image exists "$base" && podman run --rm "$base" test -e /etc/dpkg/dpkg.cfg.d/docker-apt-speedup 2>/dev/null &&
    return 0
  if [ ! -s "$tarball" ]; then
    local mirror rootfs=$work/rootfs
    mirror=$(sed -n 's/^URIs: *\([^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
    step "debootstrap bookworm minbase from $mirror"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
      skip "debootstrap failed (no Debian mirror reachable?): $(tail -1 "$work/debootstrap.log")"
    rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* \
      "$rootfs"/usr/share/info/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*
    printf '%s\n' force-unsafe-io >"$rootfs/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
    printf 'path-exclude /usr/share/%s/*\n' doc groff info linda lintian/overrides locale man \
      >"$rootfs/etc/dpkg/dpkg.cfg.d/docker"
    printf '%s\n' 'path-include /usr/share/doc/*/copyright' >>"$rootfs/etc/dpkg/dpkg.cfg.d/docker"
    printf '%s\n' 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
    printf '%s\n' 'Acquire::GzipIndexes "true";' >"$rootfs/etc/apt/apt.conf.d/docker-gzip-indexes"
    tar -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
  fi
  step "importing the base image"
  podman import "$tarball" "$base" >/dev/null 2>&1 ||
    fail "podman import"
}

# The fenced block after "<!-- container-test: NAME -->" in FILE, as written.
doc_block_in() {  # FILE NAME
  python3 - "$1" "$2" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"<!-- container-test: " + re.escape(sys.argv[2]) + r" -->\s*```\w*\n(.*?)```", text, re.S)
if not m:
    sys.exit(sys.argv[1] + " has no container-test block " + sys.argv[2])
print(m.group(1), end="")
PY
}
