#!/bin/bash
# The sidecar image, built and run for real with podman (../../../shared/specs/containers.md): a local
# stand-in for debian:bookworm-slim (debootstrapped, cached under the build dir), the image built from
# source as deployment.md documents it (build-source.sh; its --version must carry this checkout's revision),
# then:
# - the image's labels (OCI version, revision, licenses), its user, HEALTHCHECK, and a non-empty system CA
#   bundle (/etc/ssl/certs/ca-certificates.crt from Debian's ca-certificates);
# - trust only through the system store: a derived image adds the test CA the Debian way
#   (/usr/local/share/ca-certificates + update-ca-certificates) and nothing sets CHARGEGUARD_STRIPE_CA_FILE.
#   The shipped image refuses fake-stripe's certificate; the derived one charges through it;
# - a pod holding the real nsqd and chargeguard, with PostgreSQL (the test server) and fake-stripe over TLS
#   beside it: events published twice are charged exactly once (checked by `chargeguard reconcile` run in the
#   image), `podman healthcheck run` is healthy, and stopping the pod ends chargeguard (PID 1) with exit 0
#   within the grace period;
# - the container commands of docs/operating/deployment.md, extracted from the document and run as written
#   (the Stripe key from STRIPE_API_KEY, then from the default secret file), each charging its events;
# - the key file's modes: root's 0400 refused (exit 78, naming uid 10001), 10001's 0400 read;
# - deploy/kubernetes/chargeguard.yaml under `podman kube play`, with the Secrets and CA that deployment.md's
#   `kubectl create` lines make, and the runbook's `chargeguard probe` commands run in the sidecar.
# Prints the image size.
#
# usage: run.sh SOURCE_ROOT BUILD_DIR      (meson passes both; env: PGHOST…, NSQD_BIN, CG_TEST_CERTS,
#                                           CHARGEGUARD_EXE, FAKE_STRIPE_EXE)
# The image: by default build-source.sh runs here (the builder's apt-get and compile: minutes, see
# docs/testing.md). CHARGEGUARD_CONTAINER_IMAGE_DIR=DIR takes the result of a build-source.sh run into DIR
# instead (ci/test starts one early in the background): a failed or skipped build, another revision, or a
# version line without this revision fails or skips the test just the same.
# CHARGEGUARD_CONTAINER_BUILD=context builds the runtime stage around this build's executable instead (a
# developer's quick check of the runtime image; it does not test the documented build).
# Skips (exit 77, one "skipped: …" line) without PostgreSQL, the real nsqd, or podman/runc/debootstrap; as root
# in CI (CI or CHARGEGUARD_CI set) it installs those packages first. The documented commands name the image
# `chargeguard`, so the test tags localhost/chargeguard:latest while they run and removes that tag after.
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
# shellcheck source=tests/container/lib.sh
source "$(dirname "$0")/lib.sh"

[ -n "${PGHOST:-}" ] || skip "PGHOST is not set (the test needs the PostgreSQL server ci/test starts)"
[ -n "${NSQD_BIN:-}" ] && [ -x "${NSQD_BIN}" ] || skip "NSQD_BIN is not set (the real nsqd 1.3.0 runs in the pod)"
ensure_tools

cache=$build/container-cache
mkdir -p "$cache"
work=$(mktemp -d /tmp/cg-container.XXXXXX)
chmod 755 "$work"
id=cg$$
pod=$id-pod
db=cg_container_$$
image=localhost/chargeguard:test
trusting=localhost/chargeguard-test-ca:test
doc_tag=localhost/chargeguard:latest
fake_pid=
doc_cids=

cleanup() {
  podman pod rm -f "$pod" >/dev/null 2>&1
  for c in $doc_cids; do podman rm -f "$c" >/dev/null 2>&1; done
  podman untag "$trusting" "$doc_tag" >/dev/null 2>&1
  podman rmi "$trusting" >/dev/null 2>&1
  [ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null
  psql -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
  psql -q -d postgres -c "DROP DATABASE IF EXISTS ${db}_doc WITH (FORCE)" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

# containers.md: runc (crun refuses the hybrid cgroup layout) and lowered default ulimits.
use_containers_conf "$work"

# --- base image: the stand-in for debian:bookworm-slim, its tarball cached under the build dir ---------------
ensure_base "$cache" "$work"

# --- the image ------------------------------------------------------------------------------------------
# OCI labels: the project's version, this checkout's commit.
version=$(sed -n "s/^ *version : '\([^']*\)'.*/\1/p" "$src/meson.build" | head -1)
revision=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
labels=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "SOURCE=file://chargeguard")
t0=$(date +%s)
if [ "${CHARGEGUARD_CONTAINER_BUILD:-source}" = context ]; then
  # The builder stage replaced by one that copies this build's executable (stripped, with the shared
  # libraries ldd finds for it): the runtime image (libraries, user, HEALTHCHECK, PID 1, SIGTERM) in a
  # minute, without the documented build.
  step "podman build of the runtime stage around this build's executable (not the documented build)"
  ctx=$work/context
  mkdir -p "$ctx/prebuilt/usr/local/bin" "$ctx/prebuilt/usr/lib"
  strip -o "$ctx/prebuilt/usr/local/bin/chargeguard" "$CHARGEGUARD_EXE" || fail "strip"
  # The same filter as the Dockerfile's builder: everything ldd lists but what the runtime stage has.
  ldd "$CHARGEGUARD_EXE" | awk '/=> \// {print $3}' |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libssl|libcrypto)\.so' |
    xargs -I{} cp -L {} "$ctx/prebuilt/usr/lib/" || fail "collecting shared libraries"
  # The Dockerfile with its builder stage (from `FROM ${BASE} AS build` to the next FROM) replaced.
  awk '/^FROM .* AS build$/ {print "FROM scratch AS build"; print "COPY prebuilt/ /out/"; skip = 1; next}
       skip && /^FROM / {skip = 0}
       !skip' "$src/Dockerfile" >"$ctx/Dockerfile"
  grep -q '^COPY prebuilt/' "$ctx/Dockerfile" || fail "the Dockerfile has no 'FROM \${BASE} AS build' stage"
  podman build --format docker --build-arg BASE="$base" "${labels[@]}" -t "$image" "$ctx" \
    >"$work/build.log" 2>&1 || {
    tail -40 "$work/build.log"
    fail "podman build"
  }
else
  # The documented build from source: here, or already run by ci/test into CHARGEGUARD_CONTAINER_IMAGE_DIR.
  built=${CHARGEGUARD_CONTAINER_IMAGE_DIR:-}
  if [ -z "$built" ]; then
    built=$work/image
    "$src/tests/container/build-source.sh" "$src" "$built" "$cache"
  else
    step "the documented build, run before into $built"
  fi
  status=$(cat "$built/status" 2>/dev/null || echo "fail: no build-source.sh result in $built")
  case $status in
    ok) ;;
    skip:*) skip "${status#skip: }" ;;
    *)
      # (build-source.sh printed the log's end already when it ran here)
      [ -n "${CHARGEGUARD_CONTAINER_IMAGE_DIR:-}" ] && tail -40 "$built/build.log" 2>/dev/null
      fail "${status#fail: }"
      ;;
  esac
  [ "$(cat "$built/revision")" = "$revision" ] || fail "the image in $built was built from $(cat "$built/revision"), not $revision"
  podman tag "$(cat "$built/image")" "$image" || fail "no image $(cat "$built/image") from the documented build"
  # The block's last command (`podman run --rm chargeguard --version`) printed the log's last line: the
  # revision passed to the build is in the image's binary.
  [ "$(tail -n 1 "$built/build.log")" = "chargeguard $version (revision $revision, release)" ] || {
    tail -5 "$built/build.log"
    fail "the image's --version does not carry revision $revision"
  }
  echo "image --version: $(tail -n 1 "$built/build.log")"
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
label() { podman image inspect --format "{{index .Labels \"org.opencontainers.image.$1\"}}" "$image"; }
[ "$(label version)" = "$version" ] || fail "label version is '$(label version)', not $version"
[ "$(label revision)" = "$revision" ] || fail "label revision is '$(label revision)', not $revision"
[ "$(label licenses)" = Apache-2.0 ] || fail "label licenses is '$(label licenses)'"
[ -n "$(label source)" ] || fail "no source label"
# The image presets no Stripe key source: STRIPE_API_KEY and the default secret file must both work.
case "$(podman image inspect --format '{{json .Config.Env}}' "$image")" in
  *STRIPE*) fail "the image presets a Stripe setting: $(podman image inspect --format '{{json .Config.Env}}' "$image")" ;;
esac

# --- the system trust store ---------------------------------------------------------------------------
# The shipped image carries Debian's bundle (OpenSSL's default verify paths).
certs=$(podman run --rm --entrypoint /bin/sh "$image" -c \
  'test -s /etc/ssl/certs/ca-certificates.crt && grep -c "BEGIN CERTIFICATE" /etc/ssl/certs/ca-certificates.crt') ||
  fail "the image has no /etc/ssl/certs/ca-certificates.crt"
[ "$certs" -gt 50 ] || fail "the image's CA bundle holds only $certs certificates"
echo "system CA bundle: $certs certificates"
# A derived image trusting the test CA the Debian way; chargeguard gets no CA file anywhere below, so a
# verified connection to fake-stripe proves the system store is what Stripe TLS uses.
# It is deployment.md's "Private CAs" Dockerfile as written, FROM this image, with the test CA as my-ca.crt.
mkdir -p "$work/trust"
cp "$CG_TEST_CERTS/ca.pem" "$work/trust/my-ca.crt" || fail "no test CA in $CG_TEST_CERTS"
doc_block_in "$src/docs/operating/deployment.md" trusting-image | sed "1s|^FROM .*|FROM $image|" \
  >"$work/trust/Containerfile" || fail "no 'trusting-image' block in deployment.md"
podman build -q --format docker -t "$trusting" -f "$work/trust/Containerfile" "$work/trust" >"$work/trust/build.log" 2>&1 || {
  cat "$work/trust/build.log"
  fail "derived image with the test CA"
}
[ "$(podman image inspect --format '{{.Config.User}}' "$trusting")" = "10001:10001" ] || fail "derived image is not non-root"

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
  -e CHARGEGUARD_TOPIC=billing -e CHARGEGUARD_CHANNEL=chargeguard \
  -e CHARGEGUARD_NSQD_TCP_ADDRESS=127.0.0.1:$nsqd_tcp \
  -e CHARGEGUARD_PG_DSN="host=127.0.0.1 port=$PGPORT user=${PGUSER:-postgres} dbname=$db" \
  -e CHARGEGUARD_MIGRATE=true \
  -e CHARGEGUARD_STRIPE_API_BASE=https://127.0.0.1:$stripe_port \
  -e CHARGEGUARD_HEALTH_LISTEN=127.0.0.1:$health \
  -e CHARGEGUARD_KEY_NAMESPACE=container \
  -e CHARGEGUARD_SHUTDOWN_TIMEOUT=20 \
  "$trusting" consume >/dev/null 2>"$work/run-cg.err" || {
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
# Every customer charged exactly once at Stripe and in the ledger: reconcile, run in the images with no CA
# file. The shipped image (Debian's roots only) must refuse fake-stripe's certificate; the derived image
# (the test CA added to the system store) verifies it and finds every customer ok.
cp "$work/events.jsonl" "$work/secrets/events.jsonl" && chmod 444 "$work/secrets/events.jsonl"
reconcile_in() {
  STRIPE_API_KEY=sk_test_container_never_logged podman run --rm --network host --read-only -e STRIPE_API_KEY \
    -v "$work/secrets/events.jsonl:/events.jsonl:ro" "$1" reconcile --expected /events.jsonl \
    --period 2026-11 --key-namespace container \
    --pg-dsn "host=127.0.0.1 port=$PGPORT user=${PGUSER:-postgres} dbname=$db" \
    --stripe-api-base "https://127.0.0.1:$stripe_port"
}
if reconcile_in "$image" >"$work/reconcile-shipped.out" 2>&1; then
  fail "the shipped image trusted fake-stripe's test CA: $(tail -3 "$work/reconcile-shipped.out")"
fi
grep -qi "certificate" "$work/reconcile-shipped.out" || {
  tail -5 "$work/reconcile-shipped.out"
  fail "the shipped image failed against fake-stripe, but not on its certificate"
}
echo "shipped image against the test CA: $(grep -io '[^"]*certificate[^"]*' "$work/reconcile-shipped.out" | head -1)"
reconcile_in "$trusting" >"$work/reconcile.out" 2>&1 || {
  cat "$work/reconcile.out"
  fail "reconcile (system store with the test CA) found unexplained items or failed"
}
grep -q "^ok  *$n\$" "$work/reconcile.out" || fail "reconcile did not count $n ok: $(cat "$work/reconcile.out")"
step "$n events charged once each (published twice), Stripe trusted through the system store only"

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

# --- docs/operating/deployment.md's container commands, as written ---------------------------------------
# Each block after a "<!-- container-test: NAME -->" line is extracted from the document and run by bash,
# unchanged, in a directory holding the key file it reads (./stripe_api_key), with the variables the document
# asks the reader to set (PG*, NSQD, HEALTH). The image it names, `chargeguard`, is the derived image (the test
# CA in its system store), and a site-wide containers.conf points its containers at fake-stripe
# (CHARGEGUARD_STRIPE_API_BASE in containers.conf's env list), so the commands need no test-only flag. Each
# must start chargeguard, read the key from the source the document names, charge its events, and stop with
# exit 0.
doc_block() { doc_block_in "$src/docs/operating/deployment.md" "$1"; }
podman tag "$trusting" "$doc_tag" || fail "tag $doc_tag"
psql -q -d postgres -c "CREATE DATABASE ${db}_doc" || fail "create database ${db}_doc"
docdir=$work/doc
mkdir -p "$docdir"
printf 'sk_test_container_never_logged\n' >"$docdir/stripe_api_key"
chmod 444 "$docdir/stripe_api_key"
{
  sed -n '1,/^\[engine\]/{/^\[engine\]/!p}' "$work/containers.conf"
  echo "env = [\"CHARGEGUARD_STRIPE_API_BASE=https://127.0.0.1:$stripe_port\"]"
  sed -n '/^\[engine\]/,$p' "$work/containers.conf"
} >"$work/containers-doc.conf"
doc_nsqd=$(free_port)
doc_nsqd_http=$(free_port)
doc_health=$(free_port)
nsqd_cid=$(podman run -d --network host -v "$NSQD_BIN:/usr/local/bin/nsqd:ro" "$base" /usr/local/bin/nsqd \
  --tcp-address=127.0.0.1:$doc_nsqd --http-address=127.0.0.1:$doc_nsqd_http --data-path=/tmp) || fail "nsqd container"
doc_cids="$doc_cids $nsqd_cid"

doc_run() { # NAME KEY_SOURCE: run the block, charge 10 events, stop; the log names KEY_SOURCE
  local name=$1 from=$2 out cid i ready= charged=0 code
  doc_block "$name" >"$work/doc-$name.sh" || fail "no '$name' block in docs/operating/deployment.md"
  out=$(cd "$docdir" && env -u STRIPE_API_KEY -u PGPASSWORD CONTAINERS_CONF="$work/containers-doc.conf" \
    PGHOST=127.0.0.1 PGPORT="$PGPORT" PGUSER="${PGUSER:-postgres}" PGDATABASE="${db}_doc" \
    NSQD="127.0.0.1:$doc_nsqd" HEALTH="127.0.0.1:$doc_health" bash -eu "$work/doc-$name.sh" 2>"$work/doc-$name.err") || {
    cat "$work/doc-$name.err"
    fail "the documented '$name' command failed"
  }
  cid=$(printf '%s\n' "$out" | tail -1) # `podman run -d` prints the container id
  doc_cids="$doc_cids $cid"
  for _ in $(seq 150); do
    "$CHARGEGUARD_EXE" probe --timeout 1 "http://127.0.0.1:$doc_health/readyz" >/dev/null 2>&1 && ready=1 && break
    sleep 0.2
  done
  [ -n "$ready" ] || {
    podman logs "$cid" 2>&1 | tail -5
    fail "'$name': chargeguard never became ready"
  }
  for i in $(seq 1 10); do
    printf '{"customer_id":"%s-%d","billing_period":"2026-11","amount_cents":%d,"currency":"usd","stripe_customer_id":"cus_doc"}\n' "$name" "$i" $((500 + i))
  done >"$work/doc-$name.jsonl"
  podman exec -i "$cid" chargeguard publish --nsqd-tcp-address 127.0.0.1:$doc_nsqd --topic billing - \
    <"$work/doc-$name.jsonl" >/dev/null 2>&1 || fail "'$name': publish"
  for _ in $(seq 300); do
    charged=$(psql -tA -d "${db}_doc" -c "SELECT count(*) FROM billing_records WHERE status = 'charged' AND customer_id LIKE '$name-%'" 2>/dev/null || echo 0)
    [ "$charged" = 10 ] && break
    sleep 0.2
  done
  [ "$charged" = 10 ] || fail "'$name': $charged of 10 events charged"
  podman stop -t 30 "$cid" >/dev/null 2>&1 || fail "'$name': stop"
  code=$(podman inspect --format '{{.State.ExitCode}}' "$cid")
  podman logs "$cid" >"$work/doc-$name.log" 2>&1
  [ "$code" = 0 ] || {
    tail -5 "$work/doc-$name.log"
    fail "'$name': chargeguard exited $code"
  }
  grep -q "\"stripe_key_from\":\"$from\"" "$work/doc-$name.log" || {
    grep -m1 'consume starting' "$work/doc-$name.log"
    fail "'$name': the key did not come from $from"
  }
  if grep -q sk_test_container_never_logged "$work/doc-$name.log"; then fail "'$name': the Stripe key was logged"; fi
  step "documented '$name' command: 10 events charged, key from $from, exit 0"
}
doc_run env-key STRIPE_API_KEY
doc_run secret-file /run/secrets/stripe_api_key
podman untag "$trusting" "$doc_tag" >/dev/null 2>&1

# --- key file modes (deployment.md "File modes") -------------------------------------------------------
# The image's user (10001) must be able to read the mounted key: root's file at 0400 stops consume at once
# with exit 78 naming the file and the uid; the same file owned by 10001 (or at 0444, above) is read. No
# PostgreSQL here (port 1): the readable case gets past the key and then fails to connect (exit 1).
mkdir -p "$work/modes"
chmod 755 "$work/modes"
printf 'sk_test_container_never_logged\n' >"$work/modes/root-0400"
chmod 400 "$work/modes/root-0400"
cp -p "$work/modes/root-0400" "$work/modes/user-0400"
chown 10001:10001 "$work/modes/user-0400"
key_mode_run() {
  podman run --rm --network none --read-only -v "$work/modes/$1:/run/secrets/stripe_api_key:ro" \
    -e CHARGEGUARD_TOPIC=billing -e CHARGEGUARD_CHANNEL=chargeguard -e CHARGEGUARD_NSQD_TCP_ADDRESS=127.0.0.1:1 \
    -e CHARGEGUARD_PG_DSN="host=127.0.0.1 port=1 dbname=x" -e CHARGEGUARD_PG_STARTUP_TIMEOUT=1s \
    "$image" consume >"$work/modes/$1.out" 2>&1
}
key_mode_run root-0400
code=$?
[ "$code" = 78 ] || fail "a root-owned 0400 key file: exit $code, not 78: $(tail -2 "$work/modes/root-0400.out")"
grep -q "cannot read the default secret file '/run/secrets/stripe_api_key': Permission denied (this process runs as uid 10001)" \
  "$work/modes/root-0400.out" || fail "a root-owned 0400 key file: $(tail -2 "$work/modes/root-0400.out")"
key_mode_run user-0400
code=$?
grep -q '"stripe_key_from":"/run/secrets/stripe_api_key"' "$work/modes/user-0400.out" && [ "$code" != 78 ] ||
  fail "a 0400 key file owned by 10001 was not read (exit $code): $(tail -2 "$work/modes/user-0400.out")"
if grep -q sk_test_container_never_logged "$work/modes/"*.out; then fail "the Stripe key was printed"; fi
step "key file modes: root's 0400 refused with exit 78 naming uid 10001; 10001's 0400 read"

# --- the Kubernetes manifest under `podman kube play` ----------------------------------------------------
# deploy/kubernetes/chargeguard.yaml as it is (tests/deploy/kube-play-prep.mjs: replicas 1, container ports on
# free host ports, the native sidecar as an ordinary container since podman 4.3 runs init containers to
# completion, the PodDisruptionBudget left out, the Secrets in the two forms podman 4.3 reads), with the image just built
# under the manifest's name and a stand-in for the billing app. Its nsqlookupd and PostgreSQL names do not
# resolve here, so the sidecar must come up live (/healthz 200, the Stripe key read from the Secret file,
# read-only root, non-root) and not ready (/readyz 503).
if command -v node >/dev/null && [ -d "$src/tests/deploy/node_modules/yaml" ]; then
  step "podman kube play deploy/kubernetes/chargeguard.yaml"
  kube=$work/kube
  mkdir -p "$kube"
  printf 'sk_test_kube_play_never_logged\n' >"$kube/stripe_api_key"
  node "$src/tests/deploy/kube-play-prep.mjs" "$src/deploy/kubernetes/chargeguard.yaml" \
    "$src/docs/operating/deployment.md" "$kube" health="$(free_port)" http="$(free_port)" \
    "file:./stripe_api_key=$kube/stripe_api_key" "file:./postgres-ca.crt=$CG_TEST_CERTS/ca.pem" \
    env:PGPASSWORD=kube-play-password || fail "kube-play-prep"
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
  for f in "$kube"/secret-*.yaml; do [ -e "$f" ] || continue; podman kube play "$f" >/dev/null 2>&1 || fail "kube play $f"; done
  for f in "$kube"/secret-*.json; do
    n=${f##*/secret-}
    podman secret rm "${n%.json}" >/dev/null 2>&1 || true  # left by a run killed before its cleanup
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
  # The startup probe's endpoint must not pass before PostgreSQL and nsqd were reached.
  if podman exec "$cg" chargeguard probe --timeout 1 http://127.0.0.1:9180/startupz >/dev/null 2>&1; then
    fail "kube play: /startupz passed without nsqd and PostgreSQL"
  fi
  [ "$(podman exec "$cg" id -u)" = 10001 ] || fail "kube play: not running as 10001"
  if podman exec "$cg" sh -c 'echo x >/probe-write' 2>/dev/null; then fail "kube play: root filesystem is writable"; fi
  podman logs "$cg" >"$kube/cg.log" 2>&1
  grep -q '"stripe_key_from":"/run/secrets/chargeguard/stripe_api_key"' "$kube/cg.log" || {
    head -3 "$kube/cg.log"
    fail "kube play: the Stripe key file is not the Secret's"
  }
  if grep -q sk_test_kube_play_never_logged "$kube/cg.log"; then fail "kube play: the Stripe key was logged"; fi
  # The runbook's confirm commands, as an operator runs them (`kubectl exec … -c chargeguard -- CMD`, here
  # `podman exec`): only what the image and the CLI provide. This sidecar is live and not ready.
  runbook=$src/docs/operating/runbook.md
  grep -qE "curl +(-|http|localhost|127)" "$runbook" && fail "runbook.md runs curl, which the image does not have"
  while read -r cmd; do
    out=$(podman exec "$cg" $cmd 2>&1)
    rc=$?
    case "$cmd" in
      *"probe /healthz"*) [ $rc = 0 ] || fail "runbook '$cmd' exited $rc: $out" ;;
      *"probe /readyz"*)
        [ $rc = 1 ] || fail "runbook '$cmd' exited $rc on a sidecar that is not ready: $out"
        # The whole body: every check, the failing ones included, not just the first line.
        [ "$(printf '%s\n' "$out" | grep -c '^\(ok\|FAIL\) ')" -ge 2 ] || fail "probe printed only part of /readyz: $out"
        printf '%s\n' "$out" | grep -q '^FAIL ' || fail "probe /readyz names no failing check: $out"
        # /readyz never says the startup passed while /startupz still waits.
        if printf '%s\n' "$out" | grep -q '^ok startup'; then fail "/readyz says 'ok startup' while /startupz is 503: $out"; fi ;;
      *"probe /metrics"*)
        [ $rc = 0 ] || fail "runbook '$cmd' exited $rc"
        printf '%s\n' "$out" | grep -q '^chargeguard_build_info{' || fail "probe /metrics printed no metrics" ;;
    esac
    echo "runbook: '$cmd' exit $rc"
  done < <(grep -o 'kubectl exec -n $NS $POD -c chargeguard -- chargeguard probe [^ `|]*' "$runbook" |
    sed 's/.* -- //' | sort -u)
  # The image's HEALTHCHECK follows CHARGEGUARD_HEALTH_LISTEN (the manifest's 0.0.0.0:9180 here).
  podman exec "$cg" chargeguard probe --timeout 2 /healthz >/dev/null || fail "kube play: probe /healthz"
  podman kube down "$kube/play.yaml" >/dev/null 2>&1 || fail "podman kube down"
  step "kube play: sidecar live, not ready without its dependencies, key from the Secret file, read-only, non-root"
else
  echo "kube play part skipped: node or tests/deploy/node_modules missing (npm ci in tests/deploy)"
fi
echo "container test passed (image $((size / 1000000)) MB)"
