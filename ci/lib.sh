# Shared by ci/test and ci/demo.

# Debian packages the build, the tests and the demo need (docs/design.md §7, plus openssl for test
# certificates and clang for the fuzz target).
CG_PACKAGES="meson ninja-build g++ pkg-config libasio-dev libssl-dev libpq-dev libsimdjson-dev
  libboost-test-dev libcrypt-dev libhttp-parser-dev libcli11-dev prometheus-cpp-dev postgresql
  postgresql-contrib openssl ca-certificates python3 procps clang clang-format libclang-rt-14-dev prometheus libsnappy-dev zlib1g-dev
  nftables iproute2 python3-yaml"

install_packages() {
  local missing=()
  for p in $CG_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]}" >&2
    local sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
    # policy-rc.d keeps the packaged cluster from starting; we start our own.
    $sudo apt-get update -qq >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      -o DPkg::Lock::Timeout=300 "${missing[@]}" >&2
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Starts a throwaway cluster and exports libpq's PG* variables plus the test hooks; stops it on exit.
start_postgres() {
  CG_PG_DIR=$(mktemp -d /tmp/cg-pg.XXXXXX)
  chmod 755 "$CG_PG_DIR"
  local port; port=$(free_port)
  "$root/ci/pg-cluster" start "$CG_PG_DIR" "$port"
  trap 'ci_cleanup' EXIT
  export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=chargeguard_test
  # Tests that restart the server call: "$CHARGEGUARD_TEST_PG_CTL" restart|stop|start "$CHARGEGUARD_TEST_PG_DIR"
  export CHARGEGUARD_TEST_PG_CTL="$root/ci/pg-cluster" CHARGEGUARD_TEST_PG_DIR=$CG_PG_DIR
  echo "== PostgreSQL on 127.0.0.1:$port ($CG_PG_DIR)" >&2
}

ci_cleanup() {
  if [ -n "${CG_PG_DIR:-}" ]; then
    "$root/ci/pg-cluster" stop "$CG_PG_DIR" || true
    rm -rf "$CG_PG_DIR"
  fi
}

# The official Stripe Node SDK pinned in tests/stripe-sdk (conformance test of fake-stripe). Without
# node/npm the test skips itself with a message.
install_node_packages() {
  if command -v npm >/dev/null 2>&1; then
    echo "== npm ci (tests/stripe-sdk)" >&2
    (cd "$root/tests/stripe-sdk" && npm ci --no-audit --no-fund --loglevel=error >&2) \
      || echo "== npm ci failed: the Stripe SDK conformance test will skip" >&2
    (cd "$root/tests/deploy" && npm ci --no-audit --no-fund --loglevel=error >&2) \
      || echo "== npm ci failed: the Kubernetes manifest test will skip" >&2
  else
    echo "== npm not found: the Stripe SDK conformance test will skip" >&2
  fi
}

# The real NSQ 1.3.0 daemons and stock clients, when this machine has them: CHARGEGUARD_NSQ_TOOLS, else
# shared/tools/nsq-1.3.0 in the nearest ancestor directory of the checkout that has one (../shared beside a
# checkout, ../../shared beside a worktree). Tests that need them read NSQD_BIN, NSQLOOKUPD_BIN,
# NSQ_TAIL_BIN and TO_NSQ_BIN and print a clear "skipped" line when they are unset.
export_nsq_tools() {
  local dir=${CHARGEGUARD_NSQ_TOOLS:-}
  if [ -z "$dir" ]; then
    local up=$root/..
    dir=$up/shared/tools/nsq-1.3.0
    while [ ! -x "$dir/nsqd" ] && [ "$(cd "$up" && pwd)" != / ]; do
      up=$up/..
      dir=$up/shared/tools/nsq-1.3.0
    done
  fi
  if [ -x "$dir/nsqd" ]; then
    dir=$(cd "$dir" && pwd)
    export NSQD_BIN=$dir/nsqd NSQLOOKUPD_BIN=$dir/nsqlookupd NSQ_TAIL_BIN=$dir/nsq_tail TO_NSQ_BIN=$dir/to_nsq
    echo "== real NSQ: $("$NSQD_BIN" --version 2>&1 | head -1)" >&2
  else
    echo "== real NSQ not found at $dir: real-broker tests will skip" >&2
  fi
}
