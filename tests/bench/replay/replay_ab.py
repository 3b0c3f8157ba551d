#!/usr/bin/env python3
"""Back-to-back comparison of builds (or flags) on the charged-run replay, one sidecar: charges N events once,
then alternates replay passes of each configuration on the same ledger and the same nsqd (A B A B …), each
with a fresh `consume`, optionally each followed by its own no-NSQ ceiling (its build's replay_ceiling). On a
shared machine the wall rates of runs minutes apart are not comparable; passes seconds apart are closer.

Usage: replay_ab.py [--events N] [--rounds R] [--ceiling] [--perf-record PREFIX [--perf-call-graph dwarf]]
                    NAME=BUILD[,--consume-flag=value…] …
e.g.   NSQD_BIN=…/nsqd replay_ab.py --ceiling before=/tmp/old-build after=build-rel \\
           after-nobackfill=build-rel,--backfill-window=0
"""
import argparse, os, signal, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import replay as R  # noqa: E402 (the path above first)

H = R.H


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=50000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ceiling", action="store_true", help="run each build's replay_ceiling after its pass")
    ap.add_argument("--perf-record", metavar="PREFIX",
                    help="perf record each pass's consume into PREFIX-NAME-ROUND.data")
    ap.add_argument("--perf-call-graph", default="fp", help="perf record --call-graph mode (default fp)")
    ap.add_argument("--perf-event", default="cpu-clock",
                    help="perf record -e (default cpu-clock; e.g. a uprobe on malloc to count allocations)")
    ap.add_argument("cfg", nargs="+", help="NAME=BUILD[,--consume-flag=value…]")
    a = ap.parse_args()
    if not H.pg_configured():
        return 0
    cfgs = []
    for c in a.cfg:
        name, rest = c.split("=", 1)
        parts = rest.split(",")
        cfgs.append((name, os.path.abspath(parts[0]), [p for p in parts[1:] if p]))
    print(f"replay A/B: {a.events} events, load {R.load()}, {os.cpu_count()} CPUs", flush=True)
    st = H.stack(cfgs[0][1], "replay_ab")
    base = ["--max-in-flight", "1000", "--stripe-request-timeout", "30", "--stripe-rate-initial", "0"]
    try:
        st.fake_stripe(0)
        st.nsqd()
        charger = st.consume(0, base + ["--backfill-window=0"])
        evs = H.events(a.events, "rp")
        t0 = time.time()
        st.publish(evs)
        got = H.wait_charged(st, a.events)
        print(f"charged {got} in {time.time() - t0:.1f} s; load {R.load()}", flush=True)
        charger.send_signal(signal.SIGTERM)
        charger.wait(30)
        rates = {n: [] for n, _, _ in cfgs}
        for rnd in range(a.rounds):
            for name, build, args in cfgs:
                st.build = build
                c = st.consume(1, base + args)
                perf = f"{a.perf_record}-{name}-{rnd}.data" if a.perf_record else None
                fig = R.replay_pass(st, [c], evs, perf, a.perf_call_graph, a.perf_event)
                c.send_signal(signal.SIGTERM)
                c.wait(30)
                rates[name].append(fig["rate"])
                ok = "all duplicates" if fig["dups"] == a.events else f"MISMATCH: {fig['dups']:.0f} duplicates"
                print(f"{name}: {fig['rate']:.0f} messages/s ({ok}); CPU-ms per message: {R.fmt_cpu(fig, fig['n'])}; "
                      f"rows per statement {', '.join(f'{r:.0f}' for r in fig['batch_rows'])}; load {R.load()}",
                      flush=True)
                if a.ceiling:
                    rate, cpu, pg, _, _ = R.ceiling(build, st.db, 1, 1000, 16)
                    print(f"  {name} ceiling: {rate:.0f} rows/s (caller {cpu:.3f}, postgres {pg:.3f} CPU-ms per row); "
                          f"replay / ceiling {fig['rate'] / rate:.2f}; load {R.load()}", flush=True)
        for n, v in rates.items():
            print(f"{n}: " + ", ".join(f"{x:.0f}" for x in v))
    finally:
        st.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
