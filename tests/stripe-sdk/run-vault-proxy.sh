#!/bin/sh
# meson test wrapper for vault-proxy.mjs: the official Stripe Node SDK against `chargeguard proxy` (a vault key)
# in front of fake-stripe. Skips (77) with a reason when Node, the pinned SDK or PostgreSQL (PGHOST) is missing.
# Usage: run-vault-proxy.sh <chargeguard binary> <fake-stripe binary> <cert dir>
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node not found; the Stripe SDK vault test needs Node.js 18+" >&2
  exit 77
fi
if [ ! -f "$here/node_modules/stripe/package.json" ]; then
  echo "SKIP: the pinned stripe SDK is not installed; run 'npm ci' in tests/stripe-sdk (ci/test does)" >&2
  exit 77
fi
if [ -z "$PGHOST" ] || ! command -v psql >/dev/null 2>&1; then
  echo "SKIP: PGHOST is not set (or psql is missing); the Stripe SDK vault test needs PostgreSQL" >&2
  exit 77
fi
db="cg_vault_sdk_$$"
psql -X -q -c "CREATE DATABASE $db" >/dev/null || exit 1
trap 'psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1' EXIT
PGDATABASE=$db NODE_EXTRA_CA_CERTS="$3/ca.pem" node "$here/vault-proxy.mjs" "$1" "$2" "$3"
