#!/usr/bin/env python3
"""deploy/prometheus/alerts.yml conventions, beside promtool's own checks (run-promtool.sh):
- every alert about one process keeps namespace, pod and job: each `by (...)` clause in its expression names
  all three, and its summary names the pod and namespace (ChargeguardAbsent has no pod to name);
- an alert on a ledger-wide gauge (every replica reads the same rows: LEDGER_WIDE below) aggregates
  `max without (instance, pod)`, so it fires once per ledger, and its summary names namespace and job, not a pod;
- every figure in the comment above a rule (a duration, or a percentage) is one of the rule's own: its
  threshold, a range selector, or its `for` (a comment saying 300 s over a rule using 900 fails);
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


# Gauges whose value is the shared ledger's (or its database's), identical on every replica.
LEDGER_WIDE = {"chargeguard_billing_oldest_pending_age_seconds", "chargeguard_billing_oldest_abandoned_age_seconds",
               "chargeguard_pg_async_replication", "chargeguard_dead_letters_open",
               "chargeguard_vault_expired_lease_cents"}
UNIT_S = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60, "minutes": 60,
          "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400}


def comments_by_alert(text):
    """The comment lines directly above each `- alert: NAME` line."""
    out, block = {}, []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        m = re.match(r"- alert:\s*(\S+)", stripped)
        if m:
            out[m.group(1)] = " ".join(block)
        block = []
    return out


def prom_seconds(d):
    return sum(float(n) * UNIT_S[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", d) if u != "ms")


def rule_figures(rule):
    """Seconds and plain numbers the rule itself uses: thresholds, range selectors, `for`."""
    expr = rule["expr"]
    figs = {float(x) for x in re.findall(r"[<>=!]=?\s*(\d+(?:\.\d+)?)", expr)}
    figs |= {prom_seconds(r) for r in re.findall(r"\[(\w+)\]", expr)}
    if "for" in rule:
        figs.add(prom_seconds(str(rule["for"])))
    return figs


def comment_figures(comment):
    """(text, value) for each duration or percentage a comment states; value in seconds or as a ratio."""
    out = []
    for n, unit in re.findall(r"(\d+(?:\.\d+)?)[\s-]?(%|(?:seconds?|sec|s|minutes?|min|hours?|h|days?)\b)", comment):
        v = float(n) / 100 if unit == "%" else float(n) * UNIT_S[unit]
        out.append((f"{n} {unit}", v))
    return out


comments = comments_by_alert(open(os.path.join(root, "deploy/prometheus/alerts.yml")).read())
anchors = {slug(h) for h in re.findall(r"^#+ (.+)$", runbook, re.M)}
exported = exported_metrics.exported(root)
# The schema gate's gauges, exported by the schema gate's change (agreed names).
exported |= {"chargeguard_schema_ok", "chargeguard_schema_version", "chargeguard_schema_required_version"}

fail = []
for r in rules:
    name, expr, ann = r["alert"], r["expr"], r.get("annotations", {})
    ledger_wide = any(m in LEDGER_WIDE for m in re.findall(r"chargeguard_[a-z0-9_]+", expr))
    summary = ann.get("summary", "")
    if ledger_wide:
        if not re.search(r"\bmax without \(instance, pod\)", expr) or re.search(r"\bby\s*\(", expr):
            fail.append(f"{name}: a ledger-wide gauge must be aggregated `max without (instance, pod)` "
                        "(once per ledger, not per replica)")
        if "$labels.pod" in summary or "$labels.namespace" not in summary or "$labels.job" not in summary:
            fail.append(f"{name}: a ledger-wide alert's summary names namespace and job, not a pod")
    else:
        for clause in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            labels = {x.strip() for x in clause.split(",")}
            if not {"namespace", "pod", "job"} <= labels:
                fail.append(f"{name}: `by ({clause})` drops namespace, pod or job")
        if name != "ChargeguardAbsent":
            if "$labels.pod" not in summary or "$labels.namespace" not in summary:
                fail.append(f"{name}: the summary does not name the namespace and pod")
    figures = rule_figures(r)
    for text, value in comment_figures(comments.get(name, "")):
        if not any(abs(value - f) < 1e-9 for f in figures):
            fail.append(f"{name}: its comment says {text}, which is not in the rule "
                        f"(threshold, range or for: {sorted(figures)})")
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
