#!/usr/bin/env python3
"""deploy/grafana/chargeguard.json: valid JSON, the panels the issue lists, every chargeguard_* metric its
queries use is one the source exports (so a renamed metric cannot leave a dashboard silently empty), and,
where promtool is installed, every query is valid PromQL (checked as a recording rule, $instance → .*).
usage: check-dashboard.py SOURCE_ROOT"""
import json, os, re, shutil, subprocess, sys, tempfile

import exported_metrics

root = sys.argv[1]
dash = json.load(open(os.path.join(root, "deploy/grafana/chargeguard.json")))
exported = exported_metrics.exported(root)
fail = []
titles = [p["title"] for p in dash["panels"]]
for want in ["Event-loop lag", "Messages by outcome", "Charges per second", "Duplicates prevented", "Stripe latency",
             "Stripe outcome classes", "Requeues by reason", "Pending ledger rows", "In-flight cap utilisation",
             "PostgreSQL errors", "Stripe throttling", "Vault cap utilisation", "Vault requests and reservations"]:
    if want not in titles:
        fail.append("missing panel " + want)
for p in dash["panels"]:
    for t in p["targets"]:
        for m in re.findall(r"chargeguard_[a-z0-9_]+", t["expr"]):
            base = re.sub(r"_(bucket|sum|count)$", "", m)
            if m not in exported and base not in exported:
                fail.append(f"{p['title']}: {m} is not exported by src/")
ids = [p["id"] for p in dash["panels"]]
if len(ids) != len(set(ids)):
    fail.append("panel ids are not unique")
if shutil.which("promtool"):
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as rules:
        rules.write("groups:\n  - name: dashboard\n    rules:\n")
        for p in dash["panels"]:
            for t in p["targets"]:
                rules.write("      - record: dashboard:query\n        expr: %s\n"
                            % json.dumps(t["expr"].replace("$instance", ".*")))
    r = subprocess.run(["promtool", "check", "rules", rules.name], capture_output=True, text=True)
    os.unlink(rules.name)
    if r.returncode != 0:
        fail.append("a query is not valid PromQL: " + (r.stdout + r.stderr).strip().replace("\n", " | "))
for f in fail:
    print("FAIL:", f)
if fail:
    sys.exit(1)
print(f"ok: {len(dash['panels'])} panels, {len(exported)} metrics exported by src/")
