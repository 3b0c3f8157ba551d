#!/usr/bin/env python3
"""ci/demo's end-of-run report and the SIGKILL/restart bookkeeping (python3's standard library only).
  metrics PORT OUT            appends this consume process's billing/Stripe counters to OUT (one JSON line);
                              called just before each SIGKILL and before the final SIGTERM, since a killed
                              process takes its counters with it
  wait-charged N TIMEOUT      until the ledger (psql, PG* variables) holds N charged rows
  stripe-latency PORT CA MS   fake-stripe answers every API call MS later (so the run lasts long enough to
                              be interrupted twice)
  report EVENTS PORT CA COUNTERS DEAD_LETTERS KILLS
                              the report: events, charges (and duplicates) and POSTs from fake-stripe,
                              duplicates prevented and replays summed over every consume process"""
import http.client
import json
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request

WANTED = {
    "chargeguard_billing_messages_total": "outcome",
    "chargeguard_stripe_idempotent_replays_total": None,
    "chargeguard_stripe_attempts_total": None,
}


def parse_metrics(text):
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name not in WANTED:
            continue
        label = WANTED[name]
        key = name
        if label and f'{label}="' in name_labels:
            key += ":" + name_labels.split(f'{label}="', 1)[1].split('"', 1)[0]
        out[key] = out.get(key, 0) + float(value)
    return out


def cmd_metrics(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            counters = parse_metrics(r.read().decode())
    except OSError as e:
        counters = {"error": str(e)}
    with open(path, "a") as f:
        f.write(json.dumps(counters) + "\n")


def charged_rows():
    r = subprocess.run(["psql", "-X", "-A", "-t", "-c", "SELECT count(*) FROM billing_records WHERE status = 'charged'"],
                       capture_output=True, text=True)
    return int(r.stdout.strip() or 0) if r.returncode == 0 else 0


def cmd_wait_charged(n, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if charged_rows() >= n:
            return
        time.sleep(0.05)
    sys.exit(f"demo: gave up waiting for {n} charged ledger rows")


def cmd_report(events, port, ca, counters_path, dead_letters, kills):
    ctx = ssl.create_default_context(cafile=ca)
    conn = http.client.HTTPSConnection("127.0.0.1", int(port), context=ctx, timeout=10)

    def get(path):
        conn.request("GET", path)
        r = conn.getresponse()
        return json.loads(r.read().decode())

    charges = get("/_admin/charges")["data"]
    ok = [c for c in charges if c.get("status") == "succeeded"]
    per_key = {}
    for c in ok:
        k = c["metadata"].get("billing_key")
        per_key[k] = per_key.get(k, 0) + 1
    duplicates = sum(n - 1 for n in per_key.values() if n > 1)
    posts = 0
    for k in per_key:
        for key in (k, k + "-g2", k + "-g3"):
            posts += get("/_admin/posts?key=" + urllib.parse.quote(key, safe=""))["count"]
    totals = {}
    for line in open(counters_path):
        for k, v in json.loads(line).items():
            if isinstance(v, (int, float)):
                totals[k] = totals.get(k, 0) + v
    prevented = int(totals.get("chargeguard_billing_messages_total:duplicate_prevented", 0))
    replays = int(totals.get("chargeguard_stripe_idempotent_replays_total", 0))
    print("== end-of-run report")
    print(f"   consume processes          {int(kills) + 1} (SIGKILLed {kills} times mid-run, restarted each time)")
    print(f"   events published           {events}")
    print(f"   Stripe charges             {len(ok)} for {len(per_key)} billing keys")
    print(f"   duplicate charges          {duplicates}")
    print(f"   duplicates prevented       {prevented} (deliveries that found the ledger row final: no Stripe call)")
    print(f"   dead letters               {dead_letters}")
    print(f"   Stripe POSTs               {posts} (fake-stripe's count over every key)")
    print(f"   Stripe idempotent replays  {replays} (a POST after a kill answered with the first charge)")
    print(f"RESULT charges={len(ok)} keys={len(per_key)} duplicates={duplicates}")


cmd = sys.argv[1]
if cmd == "metrics":
    cmd_metrics(sys.argv[2], sys.argv[3])
elif cmd == "wait-charged":
    cmd_wait_charged(int(sys.argv[2]), float(sys.argv[3]))
elif cmd == "stripe-latency":
    ctx = ssl.create_default_context(cafile=sys.argv[3])
    req = urllib.request.Request(f"https://127.0.0.1:{sys.argv[2]}/_admin/faults", data=f"latency_ms={sys.argv[4]}".encode())
    urllib.request.urlopen(req, context=ctx, timeout=5).read()
elif cmd == "report":
    cmd_report(*sys.argv[2:8])
else:
    sys.exit(f"unknown command {cmd}")
