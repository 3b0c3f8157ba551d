#!/bin/sh
# meson test wrapper: skips (77) with a reason when Node or the pinned SDK is missing.
# Usage: run-conformance.sh <fake-stripe binary> <cert dir>
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node not found; the Stripe SDK conformance test needs Node.js 18+" >&2
  exit 77
fi
if [ ! -f "$here/node_modules/stripe/package.json" ]; then
  echo "SKIP: the pinned stripe SDK is not installed; run 'npm ci' in tests/stripe-sdk (ci/test does)" >&2
  exit 77
fi
NODE_EXTRA_CA_CERTS="$2/ca.pem" exec node "$here/conformance.mjs" "$1" "$2"
