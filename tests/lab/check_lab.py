#!/usr/bin/env python3
"""Runs chargeguard-lab --json and checks what the lab exists to show: every unsafe variant charged some
customer twice, every safe variant (the real pipeline) charged each customer exactly once, and every
scenario produced both rows with exactly the table's fields. Skips (exit 77) without PostgreSQL."""
import json
import os
import subprocess
import sys
import time

FIELDS = {"scenario", "variant", "deliveries", "stripe_posts", "charges_created", "duplicate_charges",
          "customers_uncharged", "nsqd_timeouts", "e_fin_failed"}


def main():
    lab = sys.argv[1]
    if not os.environ.get("PGHOST"):
        print("skipped: PGHOST is not set (the lab needs PostgreSQL)")
        return 77
    if not os.environ.get("NSQD_BIN"):
        print("note: NSQD_BIN unset: FM2b/FM3/FM3b run on fake-nsqd")
    names = subprocess.run([lab, "--list"], check=True, capture_output=True, text=True).stdout.split("\n")
    expected = {line.split()[0] for line in names if line.strip()}
    start = time.monotonic()
    run = subprocess.run([lab, "--json", "--log-level", "error"], capture_output=True, text=True, timeout=280)
    took = time.monotonic() - start
    sys.stderr.write(run.stderr)
    if run.returncode != 0:
        print(f"FAIL: chargeguard-lab exited {run.returncode}")
        return 1
    rows = json.loads(run.stdout)
    failures = []
    seen = set()
    for r in rows:
        print(json.dumps(r))
        if set(r) != FIELDS:
            failures.append(f"{r.get('scenario')}/{r.get('variant')}: fields {sorted(r)}")
            continue
        seen.add((r["scenario"], r["variant"]))
        name = f"{r['scenario']} {r['variant']}"
        if r["variant"] == "unsafe":
            if r["duplicate_charges"] < 1:
                failures.append(f"{name}: no duplicate charge — the failure mode was not reproduced")
        elif r["variant"] == "safe":
            if r["duplicate_charges"] != 0:
                failures.append(f"{name}: {r['duplicate_charges']} duplicate charge(s)")
            if r["customers_uncharged"] != 0:
                failures.append(f"{name}: {r['customers_uncharged']} customer(s) left uncharged")
            if r["charges_created"] == 0:
                failures.append(f"{name}: nothing charged")
        else:
            failures.append(f"{name}: unknown variant")
        if r["deliveries"] == 0 or r["stripe_posts"] == 0:
            failures.append(f"{name}: no delivery or no Stripe POST — the scenario did not run")
    for n in sorted(expected):
        for v in ("unsafe", "safe"):
            if (n, v) not in seen:
                failures.append(f"{n} {v}: row missing")
    # The heart of FM3/FM3b: the fix keeps every delivery in time.
    for r in rows:
        if r["scenario"] in ("FM3", "FM3b") and r["variant"] == "safe" and r["nsqd_timeouts"] != 0:
            failures.append(f"{r['scenario']} safe: {r['nsqd_timeouts']} nsqd timeouts")
        if r["scenario"] in ("FM3", "FM3b") and r["variant"] == "unsafe" and r["nsqd_timeouts"] == 0:
            failures.append(f"{r['scenario']} unsafe: no nsqd timeout")
    print(f"lab: {len(rows)} rows in {took:.0f} s")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
