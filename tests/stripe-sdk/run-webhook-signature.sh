#!/bin/sh
# meson test wrapper: skips (77) with a reason when Node or the pinned SDK is missing.
# Usage: run-webhook-signature.sh <webhook-verify binary>
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null 2>&1; then
  echo "skipped: node not found; the Stripe webhook signature cross-check needs Node.js 18+" >&2
  exit 77
fi
if [ ! -f "$here/node_modules/stripe/package.json" ]; then
  echo "skipped: the pinned stripe SDK is not installed; run 'npm ci' in tests/stripe-sdk (ci/test does)" >&2
  exit 77
fi
exec node "$here/webhook-signature.mjs" "$1"
