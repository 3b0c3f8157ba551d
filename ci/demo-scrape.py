#!/usr/bin/env python3
"""Small HTTP helpers for ci/demo (python3's standard library only).
  wait-ready PORT        until GET /readyz answers 200 (30 s at most)
  wait-lines FILE N      until FILE has N lines (30 s at most)
  scrape PORT            prints /healthz, /readyz and the interesting /metrics lines
  nsqd-stats PORT        prints fake-nsqd's channel counters from /stats?format=json
  wait-drained PORT N    until fake-nsqd's channels took N messages and hold none (60 s at most)
  stripe-charges PORT CA prints fake-stripe's charge count and distinct billing keys (HTTPS, verified)"""
import json
import ssl
import sys
import time
import urllib.error
import urllib.request


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def until(pred, what, limit=30.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit(f"demo: gave up waiting for {what}")


cmd = sys.argv[1]
if cmd == "wait-ready":
    until(lambda: get(f"http://127.0.0.1:{sys.argv[2]}/readyz")[0] == 200, "/readyz")
elif cmd == "wait-lines":
    path, n = sys.argv[2], int(sys.argv[3])
    until(lambda: sum(1 for _ in open(path)) >= n, f"{n} lines in {path}")
elif cmd == "scrape":
    base = f"http://127.0.0.1:{sys.argv[2]}"
    for path in ("/healthz", "/readyz"):
        status, body = get(base + path)
        print(f"GET {path} -> {status}: {body.strip()}")
    status, body = get(base + "/metrics")
    print(f"GET /metrics -> {status}")
    for line in body.splitlines():
        if line.startswith(("chargeguard_billing_messages_total", "chargeguard_stripe_requests_total{operation=\"create_charge\"",
                            "chargeguard_stripe_idempotent_replays_total", "chargeguard_nsq_messages", "chargeguard_nsq_fin_failed", "chargeguard_nsq_connections",
                            "chargeguard_event_loop_lag_seconds_count", "chargeguard_event_loop_lag_seconds_sum")):
            print("  " + line)
elif cmd == "nsqd-stats":
    s = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[2]}/stats?format=json"))
    for t in s["topics"]:
        for c in t["channels"]:
            print(f"fake-nsqd /stats: topic={t['topic_name']} channel={c['channel_name']} depth={c['depth']} "
                  f"in_flight={c['in_flight_count']} timeouts={c['timeout_count']} requeues={c['requeue_count']} "
                  f"messages={c['message_count']}")
elif cmd == "wait-drained":
    def drained():
        s = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[2]}/stats?format=json", timeout=2))
        chans = [c for t in s["topics"] for c in t["channels"]]
        return chans and all(c["message_count"] >= int(sys.argv[3]) and c["depth"] == 0 and
                             c["in_flight_count"] == 0 and c["deferred_count"] == 0 for c in chans)
    until(drained, f"{sys.argv[3]} messages handled", 60.0)
elif cmd == "stripe-charges":
    ctx = ssl.create_default_context(cafile=sys.argv[3])
    s = json.load(urllib.request.urlopen(f"https://127.0.0.1:{sys.argv[2]}/_admin/charges", context=ctx))
    keys = {c["metadata"].get("billing_key") for c in s["data"]}
    print(f"{s['count']} {len(keys)}")
else:
    sys.exit(f"unknown command {cmd}")
