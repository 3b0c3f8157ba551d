#!/usr/bin/env python3
"""Runs chargeguard-lab --json and checks what the lab exists to show: every unsafe variant charged some
customer twice, every safe variant (the real pipeline) charged each customer exactly once, and every
scenario produced its rows with exactly the table's fields. The spend-cap scenario's runs through the vault
proxy carry "charged/cap" in their variant text ("unsafe+cap 11058/11060"): the capped unsafe run must stop
at the cap (charged ≤ cap, yet past the expected total: the unsafe key did overspend until the cap refused
it) with fewer duplicates and fewer POSTs reaching Stripe than the same consumer straight to Stripe; the
pipeline through the proxy charges exactly the expected total, which the cap is 110 % of.
Skips (exit 77) without PostgreSQL."""
import json
import os
import re
import subprocess
import sys
import time

CAPPED = re.compile(r"^(unsafe|safe)\+cap (\d+)/(\d+)$")

FIELDS = {"scenario", "variant", "deliveries", "stripe_posts", "charges_created", "duplicate_charges",
          "customers_uncharged", "nsqd_timeouts", "e_fin_failed"}


def check_spend_cap(rows, capped):
    """The vault rows: the spend cap is the layer that stopped the unsafe key."""
    failures = []
    if not any(r["scenario"] == "layer-spend-cap" for r in rows):
        return failures
    for v in ("unsafe", "safe"):
        if ("layer-spend-cap", v) not in capped:
            failures.append(f"layer-spend-cap {v}+cap C/P: row missing")
    if failures:
        return failures
    direct = next((r for r in rows if r["scenario"] == "layer-spend-cap" and r["variant"] == "unsafe"), None)
    unsafe, u_charged, u_cap = capped[("layer-spend-cap", "unsafe")]
    _, s_charged, s_cap = capped[("layer-spend-cap", "safe")]
    expected = s_charged  # the pipeline charged every customer once (checked above): the expected total
    if s_cap != expected * 110 // 100:
        failures.append(f"safe+cap: cap {s_cap} is not floor(expected {expected} x 1.10)")
    if u_cap != s_cap:
        failures.append(f"unsafe+cap: cap {u_cap}, but the same events were capped at {s_cap} for the pipeline")
    if u_charged > u_cap:
        failures.append(f"unsafe+cap: charged {u_charged} cents, past the cap of {u_cap}")
    if u_charged <= expected:
        failures.append(f"unsafe+cap: charged {u_charged} <= expected {expected}: the cap was never what stopped it")
    if direct is None:
        failures.append("layer-spend-cap unsafe (straight to Stripe): row missing")
    else:
        if unsafe["duplicate_charges"] >= direct["duplicate_charges"]:
            failures.append(f"unsafe+cap: {unsafe['duplicate_charges']} duplicates, not fewer than "
                            f"{direct['duplicate_charges']} straight to Stripe")
        if unsafe["stripe_posts"] >= direct["stripe_posts"]:
            failures.append(f"unsafe+cap: {unsafe['stripe_posts']} POSTs reached Stripe, not fewer than "
                            f"{direct['stripe_posts']} straight to Stripe (the refused ones must never be forwarded)")
    return failures


# Rows whose unsafe failure is "never", not "twice": a customer left uncharged while the books say charged.
CHARGED_ZERO_TIMES = {"settle-later"}


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
    capped = {}  # (scenario, "unsafe" | "safe") → (row, charged cents, cap cents)
    for r in rows:
        print(json.dumps(r))
        if set(r) != FIELDS:
            failures.append(f"{r.get('scenario')}/{r.get('variant')}: fields {sorted(r)}")
            continue
        name = f"{r['scenario']} {r['variant']}"
        variant = r["variant"]
        if m := CAPPED.match(variant):
            variant = m.group(1)
            capped[(r["scenario"], variant)] = (r, int(m.group(2)), int(m.group(3)))
            seen.add((r["scenario"], variant + "+cap"))
        seen.add((r["scenario"], variant))
        if variant == "unsafe" and r["scenario"] in CHARGED_ZERO_TIMES:
            if r["customers_uncharged"] < 1:
                failures.append(f"{name}: every customer charged — the failure mode was not reproduced")
        elif variant == "unsafe":
            if r["duplicate_charges"] < 1:
                failures.append(f"{name}: no duplicate charge — the failure mode was not reproduced")
        elif variant == "safe":
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
    failures += check_spend_cap(rows, capped)
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
