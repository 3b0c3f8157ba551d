#!/usr/bin/env python3
"""deploy/prometheus/alerts.yml conventions, beside promtool's own checks (run-promtool.sh):
- every alert keeps namespace, pod and job: each `by (...)` clause in its expression names all three;
- its summary names what is affected ($labels.pod and $labels.namespace; ChargeguardAbsent has no pod to name);
- its runbook_url points to a section of docs/operating/runbook.md that exists;
- tests/deploy/alerts_test.yml evaluates it at least once firing and once quiet;
- every chargeguard_* metric it uses is one src/ exports (a renamed metric cannot silence an alert), or one of
  the names another part of the code base is agreed to export.
usage: check-alerts.py SOURCE_ROOT"""
import os
import re
import sys

import exported_metrics

try:
    import yaml
except ImportError:
    print("skipped: python3-yaml not installed")
    sys.exit(77)

root = sys.argv[1]
rules = [r for g in yaml.safe_load(open(os.path.join(root, "deploy/prometheus/alerts.yml")))["groups"]
         for r in g["rules"] if "alert" in r]
tests = yaml.safe_load(open(os.path.join(root, "tests/deploy/alerts_test.yml")))["tests"]
runbook = open(os.path.join(root, "docs/operating/runbook.md")).read()


def slug(heading):
    # GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens.
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


anchors = {slug(h) for h in re.findall(r"^#+ (.+)$", runbook, re.M)}
exported = exported_metrics.exported(root)
# The schema gate's gauges, exported by the schema gate's change (agreed names).
exported |= {"chargeguard_schema_ok", "chargeguard_schema_version", "chargeguard_schema_required_version"}

fail = []
for r in rules:
    name, expr, ann = r["alert"], r["expr"], r.get("annotations", {})
    for clause in re.findall(r"\bby\s*\(([^)]*)\)", expr):
        labels = {x.strip() for x in clause.split(",")}
        if not {"namespace", "pod", "job"} <= labels:
            fail.append(f"{name}: `by ({clause})` drops namespace, pod or job")
    if name != "ChargeguardAbsent":
        summary = ann.get("summary", "")
        if "$labels.pod" not in summary or "$labels.namespace" not in summary:
            fail.append(f"{name}: the summary does not name the namespace and pod")
    url = ann.get("runbook_url", "")
    m = re.fullmatch(r"docs/operating/runbook\.md#([\w-]+)", url)
    if not m:
        fail.append(f"{name}: runbook_url '{url}' is not a section of docs/operating/runbook.md")
    elif m.group(1) not in anchors:
        fail.append(f"{name}: runbook section #{m.group(1)} does not exist")
    evals = [e for t in tests for e in t.get("alert_rule_test", []) if e["alertname"] == name]
    if not any(e.get("exp_alerts") for e in evals):
        fail.append(f"{name}: no promtool test shows it firing")
    if not any(not e.get("exp_alerts") for e in evals):
        fail.append(f"{name}: no promtool test shows it quiet")
    for metric in re.findall(r"chargeguard_[a-z0-9_]+", expr):
        base = re.sub(r"_(bucket|sum|count)$", "", metric)
        if metric not in exported and base not in exported:
            fail.append(f"{name}: {metric} is not exported by src/")
for f in fail:
    print("FAIL:", f)
if fail:
    sys.exit(1)
print(f"ok: {len(rules)} alerts keep namespace/pod/job, link the runbook and are tested firing and quiet")
