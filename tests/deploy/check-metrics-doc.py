#!/usr/bin/env python3
"""docs/operating/metrics.md against the source: its table has one row for every chargeguard_* metric src/
registers, and no row for a name src/ does not register (a renamed or new metric cannot leave the operators'
reference stale).
usage: check-metrics-doc.py SOURCE_ROOT"""
import os
import re
import sys

from exported_metrics import exported

root = sys.argv[1]
doc = open(os.path.join(root, "docs/operating/metrics.md")).read()
rows = re.findall(r"^\| `(chargeguard_[a-z0-9_]+)`", doc, re.M)
src = exported(root)
fail = [f"{m} is registered under src/ but has no row in docs/operating/metrics.md" for m in sorted(src - set(rows))]
fail += [f"{m} has a row in docs/operating/metrics.md but src/ does not register it" for m in sorted(set(rows) - src)]
fail += [f"{m} has more than one row" for m in sorted({m for m in rows if rows.count(m) > 1})]
for f in fail:
    print("FAIL:", f)
if fail:
    sys.exit(1)
print(f"ok: {len(rows)} rows, {len(src)} metrics registered under src/")
