#!/bin/sh
# deploy/kubernetes/*.yaml validated offline against the Kubernetes schemas (kubernetes-models, pinned in
# package-lock.json; ci/lib.sh runs npm ci here). usage: run-validate.sh SOURCE_ROOT. Skips (77) without node
# or the installed packages.
set -eu
root=$1
command -v node >/dev/null 2>&1 || { echo "skipped: node not installed"; exit 77; }
for p in kubernetes-models @kubernetes-models/prometheus-operator yaml; do
  [ -d "$root/tests/deploy/node_modules/$p" ] ||
    { echo "skipped: $p missing: run 'npm ci' in tests/deploy (ci/lib.sh install_node_packages does)"; exit 77; }
done
node "$root/tests/deploy/validate.mjs" "$root/deploy/kubernetes"
