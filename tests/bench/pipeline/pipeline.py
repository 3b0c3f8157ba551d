#!/usr/bin/env python3
"""Pipeline benchmark (issue 12): real processes end to end — the built `chargeguard consume`, fake-nsqd (or
the real nsqd when NSQD_BIN is set), fake-stripe over TLS, PostgreSQL from PG* — and the figures they give:
charges/s, publish → charged latency, event-loop lag p99 (from /metrics), CPU-s per 1000 charges, peak RSS,
nsqd-side timeouts under a 120 s Stripe stall, and 3 sidecars sharing a 25/s Stripe endpoint limit.

Usage: pipeline [--quick] [--only throughput|stall|sidecars] [--latency MS]… [--max-in-flight N]… [--repeat N]
                [--waves N] [--pin-loop] [--stripe-max-connections N] [--consume-prefix CMD]
                [--consume-arg=--flag=value]… [--build DIR]
Built into build/tests/bench/pipeline/pipeline; not run by meson test. Prints one table row per run; each
throughput row is followed by the CPU seconds per 1 000 charges of every process (consume, PostgreSQL, nsqd,
fake-stripe), the event loop thread's running / waiting-for-a-CPU shares, rows per ledger group-commit
statement, the mean Stripe call time, and the steady state (rate and Stripe call time between the moments
25 % and 75 % of the events were charged). Loop lag is the histogram of the charging run only.
Compare two settings with alternating runs (A B A B …): this machine's speed drifts within the hour.
"""
import argparse, json, os, shlex, shutil, signal, socket, ssl, subprocess, sys, tempfile, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
# --consume-prefix: a command consume runs under (valgrind --tool=callgrind …), for instruction counts that
# the shared machine's load does not blur.
CONSUME_PREFIX = []


def pg_configured():
    """True when PG* names a PostgreSQL server the benchmark may create databases on; else says it skips."""
    if os.environ.get("PGHOST"):
        return True
    print("skipped: set PGHOST/PGPORT/PGUSER (a PostgreSQL server the bench may create databases on)")
    return False


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def psql(sql, db=None):
    env = dict(os.environ)
    if db:
        env["PGDATABASE"] = db
    out = subprocess.run(["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql], env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"psql: {out.stderr.strip()}")
    return out.stdout.strip()


class psql_session:
    """One long-lived psql for the polls: a new psql per poll costs PostgreSQL ~30 ms of CPU for the backend's
    start-up (measured here), which at ten polls a second took a fifth of a core from the run it measured."""

    def __init__(self, db):
        env = dict(os.environ, PGDATABASE=db)
        self.p = subprocess.Popen(["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=1)

    def scalar(self, sql):
        self.p.stdin.write(sql.rstrip().rstrip(";") + ";\n\\echo __done__\n")
        self.p.stdin.flush()
        out = []
        for line in self.p.stdout:
            if line.strip() == "__done__":
                return "".join(out).strip()
            out.append(line)
        raise RuntimeError("psql session ended")

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()


class stack:
    """One run's processes; everything is killed and removed on exit."""

    def __init__(self, build, name):
        self.build, self.name, self.procs, self.session = build, name, [], None
        self.tmp = tempfile.mkdtemp(prefix="cg-bench-")
        self.db = f"cg_bench_{name}_{os.getpid()}"
        psql(f"DROP DATABASE IF EXISTS {self.db}")
        psql(f"CREATE DATABASE {self.db}")
        self.certs = os.path.join(build, "tests/unit/http/client")
        self.ctx = ssl.create_default_context(cafile=os.path.join(self.certs, "ca.pem"))

    def spawn(self, argv, env=None, log=None):
        out = open(os.path.join(self.tmp, (log or os.path.basename(argv[0])) + ".log"), "wb")
        p = subprocess.Popen(argv, stdout=subprocess.PIPE if log is None else out, stderr=out, env=env)
        self.procs.append(p)
        return p

    def fake_stripe(self, latency_ms, extra=()):
        p = self.spawn([os.path.join(self.build, "tests/doubles/stripe/fake-stripe"), "--listen", "127.0.0.1:0",
                        "--cert", os.path.join(self.certs, "server.pem"), "--key", os.path.join(self.certs, "server.key"),
                        "--latency-ms", str(latency_ms), *extra])
        line = p.stdout.readline().decode()
        self.stripe_port = int(line.rsplit(":", 1)[1])
        return p

    def stripe_admin(self, path, form=None):
        data = None if form is None else "&".join(f"{k}={v}" for k, v in form.items()).encode()
        with urllib.request.urlopen(f"https://127.0.0.1:{self.stripe_port}{path}", data=data, context=self.ctx) as r:
            return json.loads(r.read())

    def nsqd(self, msg_timeout_s=60):
        self.nsq_tcp, self.nsq_http = free_port(), free_port()
        if os.environ.get("NSQD_BIN"):
            data = os.path.join(self.tmp, "nsqd-data")
            os.makedirs(data)
            self.spawn([os.environ["NSQD_BIN"], "--tcp-address", f"127.0.0.1:{self.nsq_tcp}", "--http-address",
                        f"127.0.0.1:{self.nsq_http}", "--data-path", data, "--msg-timeout", f"{msg_timeout_s}s",
                        "--max-rdy-count", "2500", "--mem-queue-size", "100000"], log="nsqd")
            self.nsq_kind = "nsqd 1.3.0"
        else:
            self.spawn([os.path.join(self.build, "tests/doubles/nsq/fake-nsqd"), "--tcp-address",
                        f"127.0.0.1:{self.nsq_tcp}", "--http-address", f"127.0.0.1:{self.nsq_http}",
                        "--msg-timeout-ms", str(msg_timeout_s * 1000)], log="fake-nsqd")
            self.nsq_kind = "fake-nsqd"
        wait_for(lambda: http_ok(f"http://127.0.0.1:{self.nsq_http}/ping"), 10, "nsqd")

    def consume(self, idx, args):
        health = free_port()
        env = dict(os.environ, STRIPE_API_KEY="sk_test_bench", PGDATABASE=self.db, CHARGEGUARD_LOG_LEVEL="warn")
        argv = [*CONSUME_PREFIX, os.path.join(self.build, "src/app/chargeguard"), "consume", "--topic", "billing", "--channel",
                "chargeguard", "--nsqd-tcp-address", f"127.0.0.1:{self.nsq_tcp}", "--migrate",
                "--stripe-api-base", f"https://127.0.0.1:{self.stripe_port}", "--stripe-ca-file",
                os.path.join(self.certs, "ca.pem"), "--health-listen", f"127.0.0.1:{health}",
                "--key-namespace", "bench", "--pg-pool-size", "16",
                *args]
        p = self.spawn(argv, env=env, log=f"consume-{idx}")
        p.health = health
        wait_for(lambda: http_ok(f"http://127.0.0.1:{health}/readyz"), 30, f"consume {idx} ready")
        p.cg_pid = chargeguard_pid(p.pid)  # under --consume-prefix (perf, valgrind) consume is a child
        return p

    def publish(self, events):
        """MPUB in batches; returns {customer_id: publish time}."""
        sent = {}
        for i in range(0, len(events), 1000):
            batch = events[i:i + 1000]
            t = time.time()
            body = "\n".join(json.dumps(e) for e in batch).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{self.nsq_http}/mpub?topic=billing", data=body)
            urllib.request.urlopen(req).read()
            for e in batch:
                sent[e["customer_id"]] = t
        return sent

    def channel_stats(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.nsq_http}/stats?format=json&topic=billing") as r:
            st = json.loads(r.read())
        for t in st.get("topics", []):
            for c in t.get("channels", []):
                if c["channel_name"] == "chargeguard":
                    return c
        return {}

    def charged(self):
        if self.session is None:
            self.session = psql_session(self.db)
        return int(self.session.scalar("SELECT count(*) FROM billing_records WHERE status = 'charged'") or 0)

    def close(self):
        if self.session is not None:
            self.session.close()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        try:
            psql(f"DROP DATABASE IF EXISTS {self.db}")
        except RuntimeError:
            pass
        if os.environ.get("CG_BENCH_KEEP"):
            print(f"  (logs kept in {self.tmp})")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except Exception:
        return False


def wait_for(cond, seconds, what):
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def wait_charged(st, n, stall_s=20, limit_s=600, marks=None):
    """Waits until n rows are charged; gives up when nothing moved for stall_s. Returns the count reached.
    `marks`: {fraction: callback(count, time)} called once when the charged count first reaches fraction × n."""
    last, moved, end = -1, time.time(), time.time() + limit_s
    pending = sorted((marks or {}).items())
    while time.time() < end:
        got = st.charged()
        while pending and got >= pending[0][0] * n:
            pending.pop(0)[1](got, time.time())
        if got >= n:
            return got
        if got != last:
            last, moved = got, time.time()
        elif time.time() - moved > stall_s:
            return got
        time.sleep(0.1)
    return last


def failure_note(st, c, n, got):
    m = metrics(c.health)
    letters = psql("SELECT count(*) FROM dead_letters", st.db)
    reasons = {r: counter(m, "chargeguard_billing_messages_total", f'outcome="{r}"')
               for r in ("requeued_postgres", "requeued_unresolved", "dead_lettered", "requeued_retry_same_key")}
    return (f"MISSED: {got} of {n} charged, then no progress for 20 s; "
            + ", ".join(f"{k} {v:.0f}" for k, v in reasons.items() if v) + f", dead letters {letters}")


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
        return r.read().decode()


def counter(text, name):
    """A label-less Prometheus counter's value (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{}"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def hist_buckets(text, name):
    buckets = []
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    return buckets


def hist_quantile(text, name, q, before=None):
    """The upper bound of the bucket holding quantile q of a Prometheus histogram (no labels); with `before`
    (an earlier scrape of the same process), of what was observed between the two scrapes only."""
    buckets = hist_buckets(text, name)
    if before is not None:
        earlier = dict(hist_buckets(before, name))
        buckets = [(le, n - earlier.get(le, 0.0)) for le, n in buckets]
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    total = buckets[-1][1]
    for le, n in buckets:
        if n >= q * total:
            return le
    return float("inf")


def counter(text, name, match=""):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and match in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def hist_mean(text, name, before=None, match=""):
    """Mean of a Prometheus histogram over its label sets that contain `match` (every set by default), of
    what was observed between the two scrapes when `before` (an earlier scrape of the same process) is given."""
    total, n = counter(text, name + "_sum", match), counter(text, name + "_count", match)
    if before is not None:
        total, n = total - counter(before, name + "_sum", match), n - counter(before, name + "_count", match)
    return total / n if n else float("nan")


def statement_label(statement):
    """The label of one kind of ledger group-commit statement in chargeguard_ledger_batch_rows."""
    return f'statement="{statement}"'


def proc_usage(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) / 1024
    return cpu, rss


def proc_cpu(pid, children=False):
    """CPU seconds of a process (plus its reaped children's when asked); 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if children else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def postgres_cpu():
    """CPU seconds of the PostgreSQL cluster: the postmaster's reaped children plus its live ones (backends,
    walwriter, checkpointer…). None when the server's data directory is not readable here."""
    pids = postgres_pids()
    if not pids:
        return None
    return proc_cpu(pids[0], children=True) + sum(proc_cpu(p) for p in pids[1:])


def main_thread_sched(pid):
    """(running s, waiting-to-run s) of the process's main thread — the event loop — from schedstat."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            run, wait, _ = f.read().split()
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def postgres_pids():
    """The PostgreSQL cluster's processes: the postmaster and its children (empty when not readable here)."""
    try:
        with open(os.path.join(psql("SHOW data_directory"), "postmaster.pid")) as f:
            pm = int(f.readline())
    except (OSError, RuntimeError, ValueError):
        return []
    pids = [pm]
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pm:
                        pids.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return pids


def chargeguard_pid(pid):
    """The chargeguard process at or below `pid` (a --consume-prefix command runs it as a child)."""
    todo = [pid]
    while todo:
        p = todo.pop(0)
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() == "chargeguard":
                    return p
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return pid


class pinned_loop:
    """--pin-loop: consume's event-loop thread alone on the last CPU, every other thread of the run (consume's
    offload threads, nsqd, fake-stripe, PostgreSQL, this script — new backends inherit the postmaster's mask) on the others.
    Shows what the loop's own work costs it in lag once other processes cannot take its CPU. Undone on exit."""

    def __init__(self, st, c):
        cpus = sorted(os.sched_getaffinity(0))
        self.loop_cpu, self.rest = {cpus[-1]}, set(cpus[:-1]) or {cpus[-1]}
        self.saved = {}
        loop = c.cg_pid
        for pid in {c.pid, loop}:
            for t in os.listdir(f"/proc/{pid}/task"):
                self.pin(int(t), self.loop_cpu if int(t) == loop else self.rest)
        for p in st.procs:
            if p.pid != c.pid:
                for t in os.listdir(f"/proc/{p.pid}/task"):
                    self.pin(int(t), self.rest)
        for pid in postgres_pids():
            self.pin(pid, self.rest)
        self.pin(os.getpid(), self.rest)  # this script and the psql it runs

    def pin(self, tid, cpus):
        try:
            self.saved.setdefault(tid, os.sched_getaffinity(tid))
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass

    def undo(self):
        for tid, cpus in self.saved.items():
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                pass


def cpu_split(st, c):
    """CPU seconds so far of each process the run involves: consume, PostgreSQL, nsqd, fake-stripe."""
    out = {"consume": proc_cpu(c.cg_pid), "postgres": postgres_cpu()}
    for p in st.procs:
        name = os.path.basename(p.args[0])
        if name in ("nsqd", "fake-nsqd", "fake-stripe"):
            out["nsqd" if "nsqd" in name else "fake-stripe"] = proc_cpu(p.pid)
    return out


def events(n, prefix):
    return [{"customer_id": f"{prefix}-{i}", "billing_period": "2026-11", "amount_cents": 1000 + i % 500,
             "currency": "usd", "stripe_customer_id": f"cus_{i % 997}"} for i in range(n)]


def latencies(st, sent):
    rows = psql("SELECT customer_id, extract(epoch FROM updated_at) FROM billing_records WHERE status = 'charged'",
                st.db).splitlines()
    lat = sorted(float(r.split("|")[1]) - sent[r.split("|")[0]] for r in rows if r.split("|")[0] in sent)
    end = max(float(r.split("|")[1]) for r in rows)
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")
    return pick(0.5), pick(0.99), end


def throughput(build, latency_ms, mif, n, extra=(), max_connections=None, pin_loop=False):
    st = stack(build, f"t{latency_ms}_{mif}")
    pin = None
    try:
        st.fake_stripe(latency_ms)
        st.nsqd()
        # As many Stripe connections as messages in flight (past 64 only while Stripe keeps its pace; at most
        # consume's --stripe-connection-cap), unless --stripe-max-connections says otherwise: fake-stripe has no
        # rate limit here, so this measures the pipeline, not Stripe's limit — consume's own default pool (at
        # most 128, what Stripe's 100 requests/s can use) would cap the charges/s at 300 ms. No slow start
        # either: not the ramp-up (AIMD stays armed for a 429).
        pool = ["--stripe-max-connections", str(max_connections or min(1024, max(16, mif)))]
        c = st.consume(0, ["--max-in-flight", str(mif), "--stripe-request-timeout", "30", *pool,
                           "--stripe-rate-initial", "0", *extra])
        if pin_loop:
            pin = pinned_loop(st, c)
        cpu0, _ = proc_usage(c.cg_pid)
        split0, sched0 = cpu_split(st, c), main_thread_sched(c.cg_pid)
        m0 = metrics(c.health)  # lag is reported for the charging run only, not start-up
        callgrind = any("callgrind" in w for w in CONSUME_PREFIX)
        if callgrind:  # count the charges only: start-up (migrations, TLS contexts) is left out
            subprocess.run(["callgrind_control", "--zero", str(c.pid)], capture_output=True, check=True)
        evs = events(n, f"t{latency_ms}-{mif}")
        start = time.time()
        sent = st.publish(evs)
        # The steady state: charges/s and the Stripe call time between the 25 % and 75 % marks, which leave out
        # the start (RDY ramp, the pool's TLS connects) and the last wave's tail.
        steady = {}
        mark = lambda key: (lambda count, t: steady.__setitem__(key, (count, t, metrics(c.health))))
        got = wait_charged(st, n, marks={0.25: mark("from"), 0.75: mark("to")})
        if got < n:
            print(f"| {latency_ms} ms | {mif} | {n} | {failure_note(st, c, n, got)} | | | | | {st.nsq_kind} |", flush=True)
            return
        p50, p99, end = latencies(st, sent)
        if callgrind:  # a dump of exactly these n charges (callgrind_annotate it; Ir / n = instructions per charge)
            subprocess.run(["callgrind_control", "--dump=charges", str(c.pid)], capture_output=True, check=True)
        cpu1, rss = proc_usage(c.cg_pid)
        split1, sched1 = cpu_split(st, c), main_thread_sched(c.cg_pid)
        m = metrics(c.health)
        rate = n / (end - start)
        lag = hist_quantile(m, "chargeguard_event_loop_lag_seconds", 0.99, before=m0)
        lag_q = " / ".join(f"{hist_quantile(m, 'chargeguard_event_loop_lag_seconds', q, before=m0) * 1000:g}"
                           for q in (0.5, 0.9, 0.99, 0.999))
        lag_n = dict(hist_buckets(m, "chargeguard_event_loop_lag_seconds")).get(float("inf"), 0) - \
            dict(hist_buckets(m0, "chargeguard_event_loop_lag_seconds")).get(float("inf"), 0)
        (c_from, t_from, m_from), (c_to, t_to, m_to) = steady["from"], steady["to"]
        steady_rate = (c_to - c_from) / (t_to - t_from) if t_to > t_from else float("nan")
        steady_call = hist_mean(m_to, "chargeguard_billing_stripe_call_duration_seconds", m_from)
        target = f"{0.9 * mif / 0.3:.0f}" if latency_ms == 300 else "5000"
        print(f"| {latency_ms} ms | {mif} | {n} | {rate:.0f} (target ≥ {target}) | {p50 * 1000:.0f} / {p99 * 1000:.0f} ms "
              f"| ≤ {lag * 1000:g} ms | {(cpu1 - cpu0) / n * 1000:.2f} | {rss:.0f} MiB | {st.nsq_kind} |", flush=True)
        # Where the time goes: every process's CPU per 1000 charges, and the event loop thread's time running
        # versus waiting for a CPU (runnable, not scheduled: the machine's other load, not a blocked loop).
        wall = end - start
        parts = ", ".join(f"{k} {(split1[k] - split0[k]) / n * 1000:.2f}" for k in split1
                          if split1[k] is not None and split0.get(k) is not None)
        print(f"|   | | | loop lag p50 / p90 / p99 / p99.9 ≤ {lag_q} ms ({lag_n:.0f} samples; consume's "
              f"--loop-lag-interval sets how often); CPU-s / 1000 charges: {parts}; event loop thread over {wall:.1f} s: running "
              f"{(sched1[0] - sched0[0]) / wall * 100:.0f} %, runnable but waiting for a CPU "
              f"{(sched1[1] - sched0[1]) / wall * 100:.0f} %; load {os.getloadavg()[0]:.1f}; Stripe TLS handshakes "
              f"{counter(m, 'chargeguard_stripe_tls_handshakes_total'):.0f} (resumed "
              f"{counter(m, 'chargeguard_stripe_tls_resumed_total'):.0f}), requests held by the pool "
              f"{counter(m, 'chargeguard_stripe_pool_held_total'):.0f}; ledger rows per statement: "
              + ", ".join(f"{k} {hist_mean(m, 'chargeguard_ledger_batch_rows', match=statement_label(k)):.1f}"
                          for k in ("preflight", "settle"))
              + f"; Stripe call (fake-stripe answers after {latency_ms} ms) mean "
              f"{hist_mean(m, 'chargeguard_billing_stripe_call_duration_seconds', m0) * 1000:.0f} ms (HTTP request "
              f"{hist_mean(m, 'chargeguard_stripe_request_duration_seconds', m0) * 1000:.0f} ms); steady state "
              f"(charged 25 % → 75 %, {t_to - t_from:.1f} s): {steady_rate:.0f} charges/s, Stripe call mean "
              f"{steady_call * 1000:.0f} ms"
              + ("; event loop pinned alone on a CPU" if pin else "") + " | | | | | |", flush=True)
    finally:
        if pin:
            pin.undo()
        st.close()


def stall(build, n):
    st = stack(build, "stall")
    try:
        st.fake_stripe(0)
        st.nsqd(msg_timeout_s=60)
        st.stripe_admin("/_admin/faults", {"stall_ms": 120000, "stall_count": n})
        c = st.consume(0, ["--max-in-flight", "100", "--msg-timeout", "60s", "--stripe-request-timeout", "180",
                           "--stripe-max-connections", "128"])
        start = time.time()
        st.publish(events(n, "stall"))
        wait_for(lambda: st.charged() >= n, 300, f"{n} charges after the stall")
        ch = st.channel_stats()
        m = metrics(c.health)
        lag = hist_quantile(m, "chargeguard_event_loop_lag_seconds", 0.99)
        touches = counter(m, "chargeguard_nsq_touches_total")
        print(f"| 120 s Stripe stall, --msg-timeout 60s | {n} | charged after {time.time() - start:.0f} s | "
              f"nsqd timeouts {ch.get('timeout_count')} (must be 0), requeues {ch.get('requeue_count')} | "
              f"TOUCHes {touches:.0f} | lag p99 ≤ {lag * 1000:g} ms | {st.nsq_kind} |", flush=True)
    finally:
        st.close()


def sidecars(build, n):
    st = stack(build, "sidecars")
    try:
        st.fake_stripe(0, ["--endpoint-rps", "25", "--rate-burst", "1"])
        st.nsqd()
        cs = [st.consume(i, ["--max-in-flight", "200", "--stripe-max-connections", "64"]) for i in range(3)]
        start = time.time()
        st.publish(events(n, "sc"))
        wait_for(lambda: st.charged() >= n, n / 20 + 120, f"{n} charges")
        _, _, end = latencies(st, {})
        stats = st.stripe_admin("/_admin/stats")
        ch = st.channel_stats()
        limits = [hist for hist in (counter(metrics(c.health), "chargeguard_stripe_rate_limit_rps") for c in cs)]
        rate = n / (end - start)
        share = stats["rate_limited"] / max(1, stats["requests"])
        dupes = stats["charges"] - n
        print(f"| 3 sidecars vs 25/s endpoint limit | {n} | {rate:.1f}/s = {rate / 25 * 100:.0f} % of the limit "
              f"(target ≥ 90 %) | 429s {stats['rate_limited']} of {stats['requests']} = {share * 100:.2f} % (target < 2 %) "
              f"| nsqd requeues {ch.get('requeue_count')}, timeouts {ch.get('timeout_count')} | duplicate charges {dupes} "
              f"| limits at the end {', '.join(f'{l:.1f}' for l in limits)}/s | {st.nsq_kind} |", flush=True)
    finally:
        st.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller counts")
    ap.add_argument("--only", choices=["throughput", "stall", "sidecars"])
    ap.add_argument("--latency", type=int, action="append", help="only these fake-stripe latencies (ms)")
    ap.add_argument("--max-in-flight", type=int, action="append", dest="mifs")
    ap.add_argument("--consume-arg", action="append", default=[],
                    help="extra argument for the throughput runs' consume (repeatable), e.g. --consume-arg=--offload-threads=1")
    ap.add_argument("--stripe-max-connections", type=int, dest="max_connections",
                    help="throughput runs' Stripe pool size (default: max(--max-in-flight, 16), at most 1024, grown "
                         "past --stripe-eager-connections only while Stripe keeps its pace)")
    ap.add_argument("--consume-prefix", default="",
                    help="run consume under this command, e.g. 'valgrind --tool=callgrind --callgrind-out-file=F'")
    ap.add_argument("--repeat", type=int, default=1, help="run each throughput row this many times")
    ap.add_argument("--waves", type=int, default=8,
                    help="at 300 ms: events = max(10 000, WAVES × --max-in-flight); more waves weigh the start-up "
                         "(RDY ramp, the Stripe pool's TLS connects) and the last wave's tail less against the steady state")
    ap.add_argument("--pin-loop", action="store_true",
                    help="throughput runs with consume's event-loop thread alone on one CPU and everything else on the "
                         "others: the lag it then shows is the loop's own work, not other processes taking its CPU")
    ap.add_argument("--build", default=os.path.abspath(os.path.join(HERE, "../../..")))
    a = ap.parse_args()
    CONSUME_PREFIX[:] = shlex.split(a.consume_prefix)
    if not pg_configured():
        return 0
    if a.only in (None, "throughput"):
        print("| Stripe latency | --max-in-flight | events | charges/s | publish→charged p50 / p99 | loop lag p99 "
              "| CPU-s / 1000 charges | peak RSS | broker |")
        print("|---|---|---|---|---|---|---|---|---|")
        for lat in a.latency or [0, 300]:
            for mif in a.mifs or [100, 1000, 2000]:
                n = (2000 if a.quick else 20000) if lat == 0 else max(2000 if a.quick else 10000, mif * a.waves)
                for _ in range(a.repeat):
                    throughput(a.build, lat, mif, n, a.consume_arg, a.max_connections, a.pin_loop)
    if a.only in (None, "stall"):
        stall(a.build, 50 if a.quick else 200)
    if a.only in (None, "sidecars"):
        sidecars(a.build, 750 if a.quick else 3000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
