#!/usr/bin/env python3
"""Charged-run replay benchmark: how fast `consume` clears a backlog of deliveries whose ledger rows are already
final (every one FINed as a duplicate, no Stripe call), against the ceiling of that path without NSQ.

One run, real processes (the built `chargeguard consume`, NSQD_BIN or fake-nsqd, fake-stripe answering at once,
PostgreSQL from PG*):
  1. charge N distinct events through one consume (the ledger now holds N `charged` rows);
  2. replay, one sidecar: stop consume (SIGSTOP), publish the same N again, resume it, time until nsqd's
     channel is empty (depth and in-flight 0) — the drain of an already-queued backlog, as after a re-publish;
  3. replay, three sidecars sharing the ledger: the same with two more consumes on the channel;
  4. the no-NSQ ceiling: `replay_ceiling` (billing::ledger::preflight, group-committed, in a loop over the
     same N rows, as many callers as --max-in-flight, consume's pool size), one process per sidecar, at once;
  5. pgbench -M prepared running the ledger's single-row pre-flight INSERT, every one a conflict, at
     --pgbench-clients clients; and the same followed by the existing-row SELECT (what one replayed message
     costs PostgreSQL done one statement at a time).
Prints rates, the CPU-ms per skipped message of every process (consume, PostgreSQL, nsqd), ratios against the
goals (≥ 90 % of the ceiling, ≥ 2× pgbench), and the machine's load. --perf-record FILE samples consume's
CPU (perf record -e cpu-clock, --perf-call-graph MODE) during the
one-sidecar replay.

Usage: replay [--events N] [--repeat R] [--max-in-flight N] [--pgbench-clients N] [--perf-record FILE [--perf-call-graph dwarf]]
              [--build DIR]
              [--consume-arg=--flag=value]…
"""
import argparse, os, signal, subprocess, sys, tempfile, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from harness import load, load_harness  # noqa: E402 (the path above first)

H = load_harness()


def outcome(ports, reason):
    return sum(H.counter(H.metrics(p), "chargeguard_billing_messages_total", f'outcome="{reason}"') for p in ports)


def drained(st):
    ch = st.channel_stats()
    return ch.get("depth", 1) == 0 and ch.get("in_flight_count", 1) == 0 and ch.get("deferred_count", 0) == 0


def cpu_of(st, cs):
    out = {"consume": sum(H.proc_cpu(c.cg_pid) for c in cs), "postgres": H.postgres_cpu()}
    for p in st.procs:
        if "nsqd" in os.path.basename(p.args[0]):
            out["nsqd"] = H.proc_cpu(p.pid)
    return out


def replay_pass(st, cs, evs, perf_file=None, call_graph="fp", event="cpu-clock"):
    """Publishes evs with every consume stopped, resumes them and times the drain. Returns the figures."""
    ports = [c.health for c in cs]
    dup0 = outcome(ports, "duplicate_prevented")
    m0 = [H.metrics(p) for p in ports]
    for c in cs:
        os.kill(c.cg_pid, signal.SIGSTOP)
    try:
        st.publish(evs)
        H.wait_for(lambda: st.channel_stats().get("depth", 0) + st.channel_stats().get("in_flight_count", 0)
                   >= len(evs), 60, "the replay published")
    finally:
        rec = None
        if perf_file:
            rec = subprocess.Popen(["perf", "record", "-q", "-e", event, "--call-graph", call_graph, "-o",
                                    perf_file, "-p", str(cs[0].cg_pid)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)  # perf attaches before the clock starts
        cpu0 = cpu_of(st, cs)
        t0 = time.time()
        for c in cs:
            os.kill(c.cg_pid, signal.SIGCONT)
    while not drained(st):
        time.sleep(0.02)
        if time.time() - t0 > 600:
            raise RuntimeError("replay did not drain in 600 s")
    wall = time.time() - t0
    cpu1 = cpu_of(st, cs)
    if rec:
        rec.send_signal(signal.SIGINT)
        rec.wait(30)
    dups = outcome(ports, "duplicate_prevented") - dup0
    m1 = [H.metrics(p) for p in ports]
    rows = [H.hist_mean(m, "chargeguard_ledger_batch_rows", before=b, match=H.statement_label("preflight"))
            for m, b in zip(m1, m0)]
    # Stripe requests of the replayed deliveries: none is the goal. The backfill's periodic listing
    # (list_charges, a timer of its own, not the delivery path) is counted apart.
    # Counted by the sidecars themselves (their own /metrics scrapes bracket the replay exactly).
    moved = lambda match: sum(H.counter(m, "chargeguard_stripe_requests_total", match) -
                              H.counter(b, "chargeguard_stripe_requests_total", match) for m, b in zip(m1, m0))
    stripe, listing = moved(""), moved('operation="list_charges"')
    n = len(evs)
    return {"listing": listing, "n": n, "wall": wall, "rate": n / wall, "dups": dups, "stripe": stripe, "batch_rows": rows,
            "cpu": {k: (cpu1[k] - cpu0[k]) if cpu1.get(k) is not None and cpu0.get(k) is not None else None
                    for k in cpu1}}


def ceiling(build, db, procs, callers, pool):
    """procs × replay_ceiling at once on the same rows; (rows/s over all, CPU-ms per row of the callers and of
    PostgreSQL, rows per statement)."""
    exe = os.path.join(build, "tests/bench/replay/replay_ceiling")
    env = dict(os.environ, PGDATABASE=db)
    pg0 = H.postgres_cpu()
    t0 = time.time()
    ps = [subprocess.Popen([exe, db, str(callers), str(pool)], env=env, stdout=subprocess.PIPE, text=True)
          for _ in range(procs)]
    outs = [p.communicate()[0] for p in ps]
    wall = time.time() - t0
    pg1 = H.postgres_cpu()
    figs = []
    for p, o in zip(ps, outs):
        if p.returncode != 0:
            raise RuntimeError(f"replay_ceiling failed: {o}")
        figs.append(dict(kv.split("=") for kv in o.split()))
    rows = sum(int(f["rows"]) for f in figs)
    slowest = max(float(f["seconds"]) for f in figs)
    cpu = sum(float(f["cpu_s"]) for f in figs)
    batch = sum(float(f["batch_rows"]) for f in figs) / len(figs)
    pg = (pg1 - pg0) / rows * 1000 if pg0 is not None and pg1 is not None else float("nan")
    return rows / slowest, cpu / rows * 1000, pg, batch, wall


# The ledger's single-row pre-flight (ledger.cpp preflight_insert_sql, parameters as literals but the key)
# and its conflict read (preflight_existing_sql): the pgbench side, on rows of its own key space.
RECORD_COLUMNS = ("key, customer_id, billing_period, amount_cents, currency, stripe_customer_id, status, charge_id, "
                  "key_generation, indeterminate_since, lease_until, first_stripe_attempt_at, stripe_attempts, "
                  "greatest(0, ceil(extract(epoch FROM lease_until - now()) * 1000))::bigint, lease_epoch")
PGB_KEY = "lpad(to_hex(:k::bigint), 32, '0')"
PGB_INSERT = (
    "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, stripe_customer_id, "
    "status, lease_until, lease_epoch, nsq_message_id, nsq_attempts, stripe_attempts, first_stripe_attempt_at, "
    "last_stripe_attempt_at, description, payment_method, off_session, key_namespace) "
    f"VALUES ({PGB_KEY}, 'pgb-' || :k::bigint, '2026-11', 1999, 'usd', 'cus_S', 'pending', "
    "now() + 30000::bigint * interval '1 millisecond', 1, '0123456789abcdef', 1, 1, now(), now(), ''::text, "
    "NULL::text, true, 'pgbench'::text) ON CONFLICT DO NOTHING RETURNING " + RECORD_COLUMNS)
PGB_SELECT = (f"SELECT {RECORD_COLUMNS} FROM billing_records WHERE key = {PGB_KEY}::text OR "
              "(customer_id = ('pgb-' || :k::bigint)::text AND billing_period = '2026-11'::text) "
              f"ORDER BY key = {PGB_KEY}::text DESC LIMIT 1")


def pgbench(db, n, clients, with_select):
    exe = os.environ.get("PGBENCH") or "pgbench"
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(f"\\set k random(1, {n})\n{PGB_INSERT};\n" + (f"{PGB_SELECT};\n" if with_select else ""))
        script = f.name
    try:
        env = dict(os.environ, PGDATABASE=db)
        pg0 = H.postgres_cpu()
        out = subprocess.run([exe, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)), "-t",
                              str(max(1, n // clients)), "-f", script, db], env=env, capture_output=True, text=True)
        pg1 = H.postgres_cpu()
        for line in out.stdout.splitlines():
            if line.startswith("tps = "):
                tps = float(line.split()[2])
                pg = (pg1 - pg0) / n * 1000 if pg0 is not None and pg1 is not None else float("nan")
                return tps, pg
        raise RuntimeError(f"pgbench: {out.stdout}{out.stderr}")
    finally:
        os.unlink(script)


def fmt_cpu(fig, n):
    return ", ".join(f"{k} {v / n * 1000:.3f}" for k, v in fig["cpu"].items() if v is not None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=20000, help="N distinct events (default 20 000)")
    ap.add_argument("--max-in-flight", type=int, default=1000)
    ap.add_argument("--pgbench-clients", type=int, default=4)
    ap.add_argument("--sidecars", type=int, action="append", help="replay with these sidecar counts (default 1, 3)")
    ap.add_argument("--repeat", type=int, default=1, help="alternating replay / ceiling runs per sidecar count (medians)")
    ap.add_argument("--perf-record", help="perf record consume (one sidecar) into this file")
    ap.add_argument("--perf-call-graph", default="fp",
                    help="perf record --call-graph mode (default fp; dwarf unwinds a build without frame pointers)")
    ap.add_argument("--consume-arg", action="append", default=[])
    ap.add_argument("--build", default=os.path.abspath(os.path.join(HERE, "../../..")))
    a = ap.parse_args()
    if not H.pg_configured():
        return 0
    n, mif = a.events, a.max_in_flight
    sidecars = a.sidecars or [1, 3]
    print(f"charged-run replay: {n} events, --max-in-flight {mif}, load (1/5/15 min) {load()}, {os.cpu_count()} CPUs")
    st = H.stack(a.build, "replay")
    try:
        st.fake_stripe(0)
        st.nsqd()
        args = ["--max-in-flight", str(mif), "--stripe-request-timeout", "30", "--stripe-rate-initial", "0",
                *a.consume_arg]
        cs = [st.consume(0, args)]
        evs = H.events(n, "rp")
        t0 = time.time()
        st.publish(evs)
        got = H.wait_charged(st, n)
        if got < n:
            print(H.failure_note(st, cs[0], n, got))
            return 1
        print(f"charge run: {n} charged in {time.time() - t0:.1f} s ({n / (time.time() - t0):.0f}/s, polled)")
        results, ceil, pairs = {}, {}, {}
        for k in sorted(sidecars):
            while len(cs) < k:
                cs.append(st.consume(len(cs), args))
            figs, ceils = [], []
            # Replay and ceiling alternate (A B A B …) so both see the same moments of a shared machine; the
            # sidecars are stopped while the ceiling runs.
            for rep in range(a.repeat):
                fig = replay_pass(st, cs[:k], evs, a.perf_record if k == 1 and rep == 0 else None,
                                  a.perf_call_graph)
                figs.append(fig)
                calls = fig["stripe"] - fig["listing"]
                ok = ("all, no Stripe call" if fig["dups"] == n and calls == 0 else
                      f"MISMATCH: {fig['dups']:.0f} duplicates, {calls:.0f} Stripe calls") + \
                    (f" (the backfill timer listed {fig['listing']:.0f} pages of charges meanwhile)" if fig["listing"] else "")
                print(f"replay, {k} sidecar{'s' if k > 1 else ''}: {fig['rate']:.0f} messages/s ({fig['wall']:.2f} s), "
                      f"duplicates skipped: {ok}; CPU-ms per skipped message: {fmt_cpu(fig, n)}; "
                      f"pre-flight rows per statement {', '.join(f'{r:.1f}' for r in fig['batch_rows'])}; "
                      f"load {load()}", flush=True)
                for c in cs:
                    os.kill(c.cg_pid, signal.SIGSTOP)
                try:
                    rate, cpu, pg, batch, _ = ceiling(a.build, st.db, k, mif, 16)
                finally:
                    for c in cs:
                        os.kill(c.cg_pid, signal.SIGCONT)
                ceils.append(rate)
                print(f"no-NSQ ceiling, {k} process{'es' if k > 1 else ''} × ledger::preflight ({mif} callers, pool 16): "
                      f"{rate:.0f} rows/s; CPU-ms per row: caller {cpu:.3f}, postgres {pg:.3f}; rows per statement "
                      f"{batch:.1f}; load {load()}", flush=True)
            mid = lambda xs: sorted(xs)[len(xs) // 2]
            results[k] = min(figs, key=lambda f: abs(f["rate"] - mid([g["rate"] for g in figs])))
            ceil[k] = mid(ceils)
            pairs[k] = [f["rate"] / c for f, c in zip(figs, ceils)]
        for c in cs:
            c.send_signal(signal.SIGTERM)
        for c in cs:
            c.wait(30)
        H.psql("INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
               "stripe_customer_id, status, charge_id, key_namespace) SELECT lpad(to_hex(k), 32, '0'), 'pgb-' || k, "
               f"'2026-11', 1999, 'usd', 'cus_S', 'charged', 'ch_pgb_' || k, 'pgbench' FROM generate_series(1, {n}) k", st.db)
        H.psql("VACUUM ANALYZE billing_records", st.db)
        pgb, pgb_pg = pgbench(st.db, n, a.pgbench_clients, False)
        pgb2, pgb2_pg = pgbench(st.db, n, a.pgbench_clients, True)
        print(f"pgbench -M prepared, {a.pgbench_clients} clients, single-row pre-flight INSERT (conflict): {pgb:.0f} tps "
              f"(postgres CPU-ms {pgb_pg:.3f}); INSERT + existing-row SELECT: {pgb2:.0f} tps (postgres CPU-ms "
              f"{pgb2_pg:.3f}); load {load()}")
        print(f"(medians of {a.repeat} alternating replay / ceiling runs; every pair's ratio: "
              + "; ".join(f"{k}: " + ", ".join(f"{x:.2f}" for x in v) for k, v in sorted(pairs.items())) + ")")
        print("| sidecars | replay msgs/s | consume CPU-ms / msg | ceiling rows/s | replay / ceiling (goal ≥ 0.90) "
              f"| pgbench INSERT tps ({a.pgbench_clients} clients) | replay / pgbench (goal ≥ 2) |")
        print("|---|---|---|---|---|---|---|")
        for k, fig in sorted(results.items()):
            r = fig["rate"]
            print(f"| {k} | {r:.0f} | {fig['cpu']['consume'] / n * 1000:.3f} | {ceil[k]:.0f} | {r / ceil[k]:.2f} "
                  f"{'yes' if r / ceil[k] >= 0.9 else 'no'} | {pgb:.0f} | {r / pgb:.2f} {'yes' if r / pgb >= 2 else 'no'} |")
        print(f"broker {st.nsq_kind}; load at the end {load()}")
    finally:
        st.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
