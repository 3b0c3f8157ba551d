#!/bin/sh
# deploy/prometheus/alerts.yml: `promtool check rules`, then the unit tests in alerts_test.yml.
# usage: run-promtool.sh SOURCE_ROOT. Skips (77) without promtool (Debian package prometheus).
set -eu
root=$1
command -v promtool >/dev/null 2>&1 || { echo "skipped: promtool not installed (apt-get install prometheus)"; exit 77; }
promtool check rules "$root/deploy/prometheus/alerts.yml"
cd "$root/tests/deploy" && promtool test rules alerts_test.yml
