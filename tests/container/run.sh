#!/bin/bash
# The sidecar image, built and run for real with podman (../../../shared/specs/containers.md): a debootstrapped
# local base image (cached under the build dir), `podman build --format docker` of the top-level Dockerfile,
# then a pod holding the real nsqd and the chargeguard image, with PostgreSQL (the test server) and fake-stripe
# over TLS beside it. Events published to nsqd are charged exactly once (checked by `chargeguard reconcile`),
# `podman healthcheck run` is healthy, and stopping the pod ends chargeguard (PID 1) with exit 0 within the
# grace period. Prints the image size.
#
# usage: run.sh SOURCE_ROOT BUILD_DIR      (meson passes both; env: PGHOST…, NSQD_BIN, CG_TEST_CERTS,
#                                           CHARGEGUARD_EXE, FAKE_STRIPE_EXE)
# Skips (exit 77, one "skipped: …" line) without PostgreSQL, the real nsqd, or podman/runc/debootstrap; as root
# in CI (CI or CHARGEGUARD_CI set) it installs those packages first.
set -uo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)

skip() {
  echo "skipped: $*"
  exit 77
}
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
step() { echo "== $(date -u +%T) $*"; }

[ -n "${PGHOST:-}" ] || skip "PGHOST is not set (the test needs the PostgreSQL server ci/test starts)"
[ -n "${NSQD_BIN:-}" ] && [ -x "${NSQD_BIN}" ] || skip "NSQD_BIN is not set (the real nsqd 1.3.0 runs in the pod)"
[ "$(id -u)" = 0 ] || skip "not root: rootful podman with runc is what works on these machines"

have_tools() {
  command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null &&
    command -v catatonit >/dev/null
}
if ! have_tools; then
  if [ -n "${CI:-}${CHARGEGUARD_CI:-}" ]; then
    # catatonit: the pod's infra (pause) process, a podman recommendation --no-install-recommends leaves out.
    step "installing podman runc debootstrap catatonit"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=300 \
      podman runc debootstrap catatonit >/dev/null || skip "apt-get install podman runc debootstrap failed"
  fi
  have_tools || skip "podman, runc, debootstrap or catatonit is not installed (CI installs them as root)"
fi

cache=$build/container-cache
mkdir -p "$cache"
work=$(mktemp -d /tmp/cg-container.XXXXXX)
chmod 755 "$work"
id=cg$$
pod=$id-pod
db=cg_container_$$
image=localhost/chargeguard:test
base=localhost/debian:bookworm-slim
fake_pid=

cleanup() {
  podman pod rm -f "$pod" >/dev/null 2>&1
  [ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null
  psql -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

# containers.md: runc (crun refuses the hybrid cgroup layout) and lowered default ulimits.
cat >"$work/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$work/containers.conf

# --- base image: debootstrap once, cache the tarball under the build dir ---------------------------------
if ! podman image exists "$base"; then
  if [ ! -s "$cache/bookworm-minbase.tar" ]; then
    mirror=$(sed -n 's/^URIs: *\([^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
    step "debootstrap bookworm minbase from $mirror"
    rootfs=$work/rootfs
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
      skip "debootstrap failed (no Debian mirror reachable?): $(tail -1 "$work/debootstrap.log")"
    rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* \
      "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*
    tar -C "$rootfs" -cf "$cache/bookworm-minbase.tar.tmp" . && mv "$cache/bookworm-minbase.tar.tmp" "$cache/bookworm-minbase.tar"
    rm -rf "$rootfs"
  fi
  step "importing the base image"
  podman import "$cache/bookworm-minbase.tar" "$base" >/dev/null 2>&1 || fail "podman import"
fi

# --- the image ------------------------------------------------------------------------------------------
# CHARGEGUARD_CONTAINER_BUILD=source compiles chargeguard inside the image (the Dockerfile's default, ~12 min
# cold on 2 cores); otherwise (CI) the image takes the executable this build made on the same Debian release,
# stripped, with the shared libraries ldd finds for it (the Dockerfile's BUILD=context), so CI tests the
# runtime image — libraries, user, HEALTHCHECK, PID 1, SIGTERM — in a minute.
mkdir -p "$cache/ccache"
t0=$(date +%s)
if [ "${CHARGEGUARD_CONTAINER_BUILD:-context}" = source ]; then
  step "podman build BUILD=source (the builder compiles only the chargeguard executable)"
  podman build --format docker --build-arg BASE="$base" -v "$cache/ccache:/ccache" -t "$image" \
    -f "$src/Dockerfile" "$src" >"$work/build.log" 2>&1 || {
    tail -40 "$work/build.log"
    fail "podman build"
  }
else
  step "podman build BUILD=context (the executable this build made, stripped, and its libraries)"
  ctx=$work/context
  mkdir -p "$ctx/prebuilt/usr/local/bin" "$ctx/prebuilt/usr/lib"
  strip -o "$ctx/prebuilt/usr/local/bin/chargeguard" "$CHARGEGUARD_EXE" || fail "strip"
  # The same filter as the Dockerfile's builder: everything ldd lists but what the base image has.
  ldd "$CHARGEGUARD_EXE" | awk '/=> \// {print $3}' |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
    xargs -I{} cp -L {} "$ctx/prebuilt/usr/lib/" || fail "collecting shared libraries"
  cp "$src/Dockerfile" "$ctx/Dockerfile"
  podman build --format docker --build-arg BASE="$base" --build-arg BUILD=context -t "$image" "$ctx" \
    >"$work/build.log" 2>&1 || {
    tail -40 "$work/build.log"
    fail "podman build"
  }
fi
step "built in $(($(date +%s) - t0)) s"
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "image size: $((size / 1000000)) MB ($size bytes)"
[ "$(podman image inspect --format '{{.Config.User}}' "$image")" = "10001:10001" ] || fail "image does not run as the non-root user"
# (no `| grep -q` under pipefail: grep exiting first makes the writer fail with SIGPIPE)
case "$(podman image inspect --format '{{json .Config.Healthcheck}}' "$image")" in
  *"chargeguard"*probe*healthz*) ;;
  *) fail "HEALTHCHECK missing from the image (built without --format docker?)" ;;
esac

# --- neighbours: PostgreSQL database, fake-stripe over TLS, the pod with nsqd ----------------------------
psql -q -d postgres -c "CREATE DATABASE $db" || fail "create database"
"$FAKE_STRIPE_EXE" --listen 127.0.0.1:0 --cert "$CG_TEST_CERTS/server.pem" --key "$CG_TEST_CERTS/server.key" \
  >"$work/fake-stripe.out" 2>"$work/fake-stripe.err" &
fake_pid=$!
for _ in $(seq 100); do grep -q listening "$work/fake-stripe.out" && break; sleep 0.1; done
stripe_port=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\).*/\1/p' "$work/fake-stripe.out")
[ -n "$stripe_port" ] || fail "fake-stripe did not start"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
nsqd_tcp=$(free_port)
nsqd_http=$(free_port)
health=$(free_port)
mkdir -p "$work/secrets"
printf 'sk_test_container_never_logged\n' >"$work/secrets/stripe_api_key"
cp "$CG_TEST_CERTS/ca.pem" "$work/secrets/stripe-ca.pem"
chmod 755 "$work/secrets"
chmod 444 "$work/secrets/"*

# The pod shares the host's network namespace so its containers reach the test's PostgreSQL and fake-stripe
# on loopback; nsqd and chargeguard still meet on 127.0.0.1 as sidecars do.
step "pod: nsqd + chargeguard"
podman pod create --name "$pod" --network host >/dev/null || fail "pod create"
podman run -d --pod "$pod" --name "$id-nsqd" -v "$NSQD_BIN:/usr/local/bin/nsqd:ro" "$base" \
  /usr/local/bin/nsqd --tcp-address=127.0.0.1:$nsqd_tcp --http-address=127.0.0.1:$nsqd_http --data-path=/tmp \
  >/dev/null || fail "nsqd container"
podman run -d --pod "$pod" --name "$id-cg" --read-only \
  -v "$work/secrets/stripe_api_key:/run/secrets/stripe_api_key:ro" \
  -v "$work/secrets/stripe-ca.pem:/run/secrets/stripe-ca.pem:ro" \
  -e CHARGEGUARD_TOPIC=billing -e CHARGEGUARD_CHANNEL=chargeguard \
  -e CHARGEGUARD_NSQD_TCP_ADDRESS=127.0.0.1:$nsqd_tcp \
  -e CHARGEGUARD_PG_DSN="host=127.0.0.1 port=$PGPORT user=${PGUSER:-postgres} dbname=$db" \
  -e CHARGEGUARD_MIGRATE=true \
  -e CHARGEGUARD_STRIPE_API_BASE=https://127.0.0.1:$stripe_port \
  -e CHARGEGUARD_STRIPE_CA_FILE=/run/secrets/stripe-ca.pem \
  -e CHARGEGUARD_HEALTH_LISTEN=127.0.0.1:$health \
  -e CHARGEGUARD_KEY_NAMESPACE=container \
  -e CHARGEGUARD_SHUTDOWN_TIMEOUT=20 \
  --health-cmd "/usr/local/bin/chargeguard probe --timeout 2 http://127.0.0.1:$health/healthz" \
  "$image" consume >/dev/null 2>"$work/run-cg.err" || {
  cat "$work/run-cg.err"
  fail "chargeguard container"
}

ready=
for _ in $(seq 150); do
  if "$CHARGEGUARD_EXE" probe --timeout 1 "http://127.0.0.1:$health/readyz" >/dev/null 2>&1; then
    ready=1
    break
  fi
  sleep 0.2
done
[ -n "$ready" ] || {
  podman logs "$id-cg" 2>&1 | tail -20
  fail "chargeguard never became ready"
}

# --- events in, charges out -----------------------------------------------------------------------------
n=50
for i in $(seq 1 $n); do
  printf '{"customer_id":"ctr-%d","billing_period":"2026-11","amount_cents":%d,"currency":"usd","stripe_customer_id":"cus_ctr"}\n' "$i" $((1000 + i))
done >"$work/events.jsonl"
# The image's own binary publishes (twice: the second run is all duplicates).
for _ in 1 2; do
  podman exec -i "$id-cg" chargeguard publish --nsqd-tcp-address 127.0.0.1:$nsqd_tcp --topic billing - \
    <"$work/events.jsonl" >/dev/null 2>&1 || fail "publish"
done
charged=0
for _ in $(seq 300); do
  charged=$(psql -tA -d "$db" -c "SELECT count(*) FROM billing_records WHERE status = 'charged'" 2>/dev/null || echo 0)
  [ "$charged" = "$n" ] && break
  sleep 0.2
done
[ "$charged" = "$n" ] || fail "$charged of $n events charged"
# Every customer charged exactly once at Stripe and in the ledger: reconcile from the host exits 0.
STRIPE_API_KEY=sk_test_container_never_logged "$CHARGEGUARD_EXE" reconcile --expected "$work/events.jsonl" \
  --period 2026-11 --key-namespace container --pg-dsn "dbname=$db" \
  --stripe-api-base "https://127.0.0.1:$stripe_port" --stripe-ca-file "$CG_TEST_CERTS/ca.pem" >"$work/reconcile.out" 2>&1 || {
  cat "$work/reconcile.out"
  fail "reconcile found unexplained items"
}
grep -q "^ok  *$n\$" "$work/reconcile.out" || fail "reconcile did not count $n ok: $(cat "$work/reconcile.out")"
step "$n events charged once each (published twice)"

rss=$(podman exec "$id-cg" sh -c 'grep VmHWM /proc/1/status' | awk '{print $2}')
# utime + stime of PID 1 (clock ticks, 100 per second): startup, migrations and the 2 × $n deliveries.
cpu=$(podman exec "$id-cg" cat /proc/1/stat | awk '{print $14 + $15}')
echo "chargeguard peak RSS after $n charges: $((rss / 1024)) MiB; CPU used since start: $((cpu * 10)) ms"

# --- health, then a clean stop ------------------------------------------------------------------------
podman healthcheck run "$id-cg" || fail "podman healthcheck run: unhealthy"
[ "$(podman inspect --format '{{.State.Health.Status}}' "$id-cg")" = healthy ] || fail "health status is not healthy"
t0=$(date +%s)
podman pod stop -t 30 "$pod" >/dev/null 2>&1 || fail "pod stop"
took=$(($(date +%s) - t0))
code=$(podman inspect --format '{{.State.ExitCode}}' "$id-cg")
podman logs "$id-cg" >"$work/cg.log" 2>&1
[ "$code" = 0 ] || {
  tail -20 "$work/cg.log"
  fail "chargeguard exited $code"
}
[ "$took" -lt 30 ] || fail "stopping took ${took}s: SIGTERM was not handled within the grace period"
grep -q '"msg":"shutdown complete".*"clean":true' "$work/cg.log" || fail "no clean shutdown in the log"
if grep -q sk_test_container_never_logged "$work/cg.log"; then fail "the Stripe key was logged"; fi
step "pod stopped in ${took}s, chargeguard exit 0"

# --- the Kubernetes manifest under `podman kube play` ----------------------------------------------------
# deploy/kubernetes/chargeguard.yaml as it is (tests/deploy/kube-play-prep.mjs: replicas 1, container ports on
# free host ports, the Job left out, the Secrets in the two forms podman 4.3 reads), with the image just built
# under the manifest's name and a stand-in for the billing app. Its nsqlookupd and PostgreSQL names do not
# resolve here, so the sidecar must come up live (/healthz 200, the Stripe key read from the Secret file,
# read-only root, non-root) and not ready (/readyz 503).
if command -v node >/dev/null && [ -d "$src/tests/deploy/node_modules/yaml" ]; then
  step "podman kube play deploy/kubernetes/chargeguard.yaml"
  kube=$work/kube
  mkdir -p "$kube"
  node "$src/tests/deploy/kube-play-prep.mjs" "$src/deploy/kubernetes/chargeguard.yaml" "$kube" \
    health="$(free_port)" http="$(free_port)" || fail "kube-play-prep"
  cg_image=$(sed -n 's/^ *image: \(.*chargeguard:.*\)$/\1/p' "$kube/play.yaml" | head -1)
  app_image=$(sed -n 's/^ *image: \(.*billing-app:.*\)$/\1/p' "$kube/play.yaml" | head -1)
  podman tag "$image" "$cg_image" || fail "tag $cg_image"
  printf 'FROM %s\nCMD ["sleep", "infinity"]\n' "$base" >"$kube/Containerfile.app"
  podman build -q --format docker -t "$app_image" -f "$kube/Containerfile.app" "$kube" >/dev/null || fail "stand-in app image"
  kube_cleanup() {
    podman kube down "$kube/play.yaml" >/dev/null 2>&1
    for f in "$kube"/secret-*; do
      n=${f##*/secret-}
      podman secret rm "${n%.*}" >/dev/null 2>&1
      podman volume rm -f "${n%.*}" >/dev/null 2>&1
    done
    podman rmi "$cg_image" "$app_image" >/dev/null 2>&1
  }
  trap 'kube_cleanup; cleanup' EXIT
  for f in "$kube"/secret-*.yaml; do podman kube play "$f" >/dev/null 2>&1 || fail "kube play $f"; done
  for f in "$kube"/secret-*.json; do
    n=${f##*/secret-}
    podman secret create "${n%.json}" "$f" >/dev/null || fail "secret create $f"
  done
  podman kube play "$kube/play.yaml" >"$kube/play.log" 2>&1 || {
    cat "$kube/play.log"
    fail "podman kube play"
  }
  cg=$(podman ps --format '{{.Names}}' | grep -- '-chargeguard$' | head -1)
  [ -n "$cg" ] || fail "no chargeguard container from kube play"
  live=
  for _ in $(seq 100); do
    podman exec "$cg" chargeguard probe --timeout 1 http://127.0.0.1:9180/healthz >/dev/null 2>&1 && live=1 && break
    sleep 0.2
  done
  [ -n "$live" ] || {
    podman logs "$cg" 2>&1 | tail -5
    fail "kube play: /healthz never answered 200"
  }
  if podman exec "$cg" chargeguard probe --timeout 1 http://127.0.0.1:9180/readyz >/dev/null 2>&1; then
    fail "kube play: ready without nsqd and PostgreSQL"
  fi
  [ "$(podman exec "$cg" id -u)" = 10001 ] || fail "kube play: not running as 10001"
  if podman exec "$cg" sh -c 'echo x >/probe-write' 2>/dev/null; then fail "kube play: root filesystem is writable"; fi
  podman logs "$cg" >"$kube/cg.log" 2>&1
  grep -q '"stripe_key_from":"/run/secrets/chargeguard/stripe_api_key"' "$kube/cg.log" || {
    head -3 "$kube/cg.log"
    fail "kube play: the Stripe key file is not the Secret's"
  }
  if grep -q sk_test_REPLACE_ME "$kube/cg.log"; then fail "kube play: the Stripe key was logged"; fi
  podman kube down "$kube/play.yaml" >/dev/null 2>&1 || fail "podman kube down"
  step "kube play: sidecar live, not ready without its dependencies, key from the Secret file, read-only, non-root"
else
  echo "kube play part skipped: node or tests/deploy/node_modules missing (npm ci in tests/deploy)"
fi
echo "container test passed (image $((size / 1000000)) MB)"
