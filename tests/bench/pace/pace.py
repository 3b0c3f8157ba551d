#!/usr/bin/env python3
"""Pace benchmark: how close `consume` sidecars sharing one Stripe account get to its limit, how many of their
requests Stripe answers 429, and how fast they follow a limit Stripe changes while they run.

fake-stripe plays a Stripe-like limiter (--endpoint-rps 25, --global-rps 100, --rate-burst 1: token buckets one
second deep, refilled continuously, answers at once; --rate-burst S and --rate-refill S pick another shape of
bucket, S seconds deep and refilled in whole tokens every S seconds); the sidecars run with chargeguard's defaults (--max-in-flight 200 each unless
--max-in-flight says otherwise).

- steady: --events published at once to 1 and 3 sidecars; the ratio of the limit reached (events / (last
  charge − publish) / 25) and the share of Stripe requests answered 429, over the whole run (start included).
- change: a backlog that never runs dry; the endpoint limit is 25/s, lowered to --low after --phase seconds,
  raised back after another --phase, measured for a last --phase. Printed for each change: the time from the
  change until Stripe's accepted rate over 2 s is within 5 % of the new limit with 429s under 5 % of it, and
  stays so for 3 s; and each phase's ratio of its limit and 429 share (its first 10 s left out).

Every figure is printed next to its goal; CPU seconds of the sidecars and fake-stripe and the load average
say how busy the shared machine was. Real processes: the built chargeguard, NSQD_BIN (or fake-nsqd),
fake-stripe, PostgreSQL from PG*.

Usage: pace [--sidecars N]… [--events N] [--only steady|change] [--low R] [--phase S] [--repeat N] [--max-in-flight N]
            [--rate-burst S] [--rate-refill S] [--build DIR] [--consume-arg=--flag=value]…
"""
import argparse, os, sys, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
LIMIT = 25.0
MAX_IN_FLIGHT = 200
BUCKET = ["--rate-burst", "1"]  # fake-stripe's bucket shape (main() adds --rate-refill when given)


sys.path.insert(0, os.path.join(HERE, "..", "common"))
from harness import load, load_harness  # noqa: E402 (the path above first)

H = load_harness()


class sampler(threading.Thread):
    """fake-stripe's counters every 200 ms: (t, accepted POSTs, requests, 429s)."""

    def __init__(self, st):
        super().__init__(daemon=True)
        self.st, self.samples, self.stop = st, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            s = self.st.stripe_admin("/_admin/stats")
            self.samples.append((time.time(), s["charges"] + s["intents"], s["requests"], s["rate_limited"]))
            self.stop.wait(0.2)

    def at(self, t):
        """The last sample at or before t (the first if none)."""
        best = self.samples[0]
        for s in self.samples:
            if s[0] > t:
                break
            best = s
        return best

    def window(self, a, b):
        """(accepted/s, 429s/s, requests) between a and b."""
        s0, s1 = self.at(a), self.at(b)
        dt = max(s1[0] - s0[0], 1e-6)
        return (s1[1] - s0[1]) / dt, (s1[3] - s0[3]) / dt, s1[2] - s0[2]


def start_stack(build, n, extra, name):
    st = H.stack(build, name)
    fs = st.fake_stripe(0, ["--endpoint-rps", str(LIMIT), "--global-rps", "100", *BUCKET])
    st.nsqd()
    cs = [st.consume(i, ["--max-in-flight", str(MAX_IN_FLIGHT), *extra]) for i in range(n)]
    return st, fs, cs


def cpu(fs, cs):
    return sum(H.proc_cpu(c.cg_pid) for c in cs), H.proc_cpu(fs.pid)


def steady(build, n, events, extra):
    st, fs, cs = start_stack(build, n, extra, f"pace_s{n}")
    try:
        c0 = cpu(fs, cs)
        start = time.time()
        st.publish(H.events(events, f"ps{n}"))
        got = H.wait_charged(st, events, stall_s=30, limit_s=events / 5 + 120)
        if got < events:
            print(f"| {n} | steady | {H.failure_note(st, cs[0], events, got)} |", flush=True)
            return
        _, _, end = H.latencies(st, {})
        c1 = cpu(fs, cs)
        stats = st.stripe_admin("/_admin/stats")
        ratio = events / (end - start) / LIMIT
        share = stats["rate_limited"] / max(1, stats["requests"])
        dupes = stats["charges"] + stats["intents"] - events
        limits = [H.counter(H.metrics(c.health), "chargeguard_stripe_rate_limit_rps") for c in cs]
        print(f"| {n} | steady, {events} events | **{ratio:.3f}** of the limit (goal ≥ 0.97) | "
              f"**{share * 100:.2f} %** 429 ({stats['rate_limited']} of {stats['requests']}; goal < 0.5 %) | "
              f"duplicates {dupes} | limits at the end {', '.join(f'{l:.1f}' for l in limits)}/s | "
              f"CPU-s: sidecars {c1[0] - c0[0]:.1f}, fake-stripe {c1[1] - c0[1]:.1f} | load {load()} |", flush=True)
    finally:
        st.close()


def recovery(sm, at, limit, until):
    """Seconds from `at` until accepted/s over 2 s is ≥ 95 % of `limit` with 429s/s ≤ 5 % of it, for 3 s."""
    x = at + 2
    while x + 3 <= until:
        if all(sm.window(y - 2, y)[0] >= 0.95 * limit and sm.window(y - 2, y)[1] <= 0.05 * limit
               for y in (x + k * 0.2 for k in range(16))):
            return x - at
        x += 0.2
    return float("nan")


def change(build, n, low, phase, extra):
    st, fs, cs = start_stack(build, n, extra, f"pace_c{n}")
    sm = sampler(st)
    try:
        c0 = cpu(fs, cs)
        st.publish(H.events(int(LIMIT * phase * 3 * 1.3) + 500, f"pc{n}"))
        t0 = time.time()
        sm.start()
        time.sleep(phase)
        t_down = time.time()
        st.stripe_admin("/_admin/limits", {"endpoint_rps": low})
        time.sleep(phase)
        t_up = time.time()
        st.stripe_admin("/_admin/limits", {"endpoint_rps": LIMIT})
        time.sleep(phase)
        t_end = time.time()
        sm.stop.set()
        sm.join()
        c1 = cpu(fs, cs)
        rows = []
        for name, a, b, lim in (("before", t0 + 10, t_down, LIMIT), ("low", t_down + 10, t_up, low),
                                ("after", t_up + 10, t_end, LIMIT)):
            acc, thr, req = sm.window(a, b)
            s0, s1 = sm.at(a), sm.at(b)
            share = (s1[3] - s0[3]) / max(1, req)
            rows.append(f"{name} {acc / lim:.3f} / {share * 100:.2f} %")
        down = recovery(sm, t_down, low, t_up)
        up = recovery(sm, t_up, LIMIT, t_end)
        print(f"| {n} | {LIMIT:g} → {low:g} → {LIMIT:g}/s, {phase:g} s each | down **{down:.1f} s**, up **{up:.1f} s** "
              f"(goal ≤ 5 s) | ratio / 429 per phase (first 10 s left out): {'; '.join(rows)} | "
              f"CPU-s: sidecars {c1[0] - c0[0]:.1f}, fake-stripe {c1[1] - c0[1]:.1f} | load {load()} |", flush=True)
        if os.environ.get("PACE_TRACE"):
            prev = sm.samples[0]
            for s in sm.samples[5::5]:
                dt = s[0] - prev[0]
                print(f"  t={s[0] - t0:6.1f}  accepted {(s[1] - prev[1]) / dt:5.1f}/s  429 {(s[3] - prev[3]) / dt:5.1f}/s")
                prev = s
    finally:
        sm.stop.set()
        st.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sidecars", type=int, action="append", help="sidecar counts (default 1 and 3)")
    ap.add_argument("--events", type=int, default=1500, help="steady: events published at once")
    ap.add_argument("--only", choices=["steady", "change"])
    ap.add_argument("--low", type=float, default=15, help="change: the lowered endpoint limit (requests/s)")
    ap.add_argument("--phase", type=float, default=30, help="change: seconds at each limit")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--max-in-flight", type=int, default=200, help="every consume's --max-in-flight")
    ap.add_argument("--rate-burst", type=float, default=1, help="fake-stripe's bucket depth, seconds of its rate")
    ap.add_argument("--rate-refill", type=float, default=0,
                    help="fake-stripe's refill: 0 continuous, else whole tokens every this many seconds")
    ap.add_argument("--consume-arg", action="append", default=[], help="extra argument for every consume")
    ap.add_argument("--build", default=os.path.abspath(os.path.join(HERE, "../../..")))
    a = ap.parse_args()
    global MAX_IN_FLIGHT, BUCKET
    MAX_IN_FLIGHT = a.max_in_flight
    BUCKET = ["--rate-burst", f"{a.rate_burst:g}", "--rate-refill", f"{a.rate_refill:g}"]
    if not H.pg_configured():
        return 0
    print(f"load before {load()}; --max-in-flight {MAX_IN_FLIGHT}; fake-stripe --endpoint-rps {LIMIT:g} --global-rps 100 "
          f"{' '.join(BUCKET)}, 0 ms; consume {' '.join(a.consume_arg) or 'defaults'}")
    print("| sidecars | run | figures | | | | | |")
    print("|---|---|---|---|---|---|---|---|")
    for _ in range(a.repeat):
        for n in a.sidecars or [1, 3]:
            if a.only in (None, "steady"):
                steady(a.build, n, a.events, a.consume_arg)
            if a.only in (None, "change"):
                change(a.build, n, a.low, a.phase, a.consume_arg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
