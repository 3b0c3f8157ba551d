#!/usr/bin/env python3
"""Partition chaos test: `chargeguard consume` workers cut off from PostgreSQL, nsqd and Stripe, and killed.

PostgreSQL, nsqd (the real one from NSQD_BIN when set, else fake-nsqd) and fake-stripe (HTTPS, a throwaway
CA whose certificate names the bridge address) listen on a private bridge; each consumer runs in its own
network namespace (netns.py). For each seed, while events are published, every 1-4 s one consumer is cut
for 2-10 s from one dependency (nft DROP of that port, both directions) or from everything (its link
down), and every 4-10 s one consumer is SIGKILLed (and restarted, like a supervisor would). Consumers that
exit on their own are restarted too (counted). Then every cut heals and the test waits for quiescence and
asserts, from the outside:
  * exactly once: one succeeded charge per distinct event at fake-stripe (by metadata billing_key), no
    charge for anything else, and the ledger row `charged` with that charge's id;
  * no false dead letter: every event is valid, so dead_letters stays empty;
  * quiescence (the above, plus nsqd's channel empty: nothing queued, in flight or deferred) within a bound
    derived from the timings (see quiescence_bound());
  * no ledger step failed fast on the pool's stale reconnect backoff (the consumers' logs): a step waits,
    bounded, for a working connection instead.

Skips (exit 77, one "skipped: ..." line) when not root or namespaces are unavailable, or a binary is
missing. Everything it creates (namespaces, veths, bridge, nft table, processes, the PostgreSQL cluster,
temp files) is removed at the end, also on failure or SIGTERM.

  partition.py --seeds 1,2                 (CI)
  partition.py --seeds 1-20 --chaos 60     (soak)
"""

import argparse
import atexit
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import chaos  # noqa: E402  the crash-chaos harness: keys, events' shape and the exactly-once assertions
import netns  # noqa: E402

WORKERS = 3
KEY_NAMESPACE = chaos.NAMESPACE
TOPIC, CHANNEL = chaos.TOPIC, chaos.CHANNEL
STRIPE_KEY = "sk_test_partition"

# The timings the issue reproduced with (short, so partitions outlast them).
MSG_TIMEOUT_S = 5
LEASE_S = 6
RENEW_S = 1
REQUEUE_DELAY_S = 1
PG_QUERY_TIMEOUT_S = 2
STRIPE_REQUEST_TIMEOUT_S = 10
# A new key generation waits until no call under the old one has shown life for this long: longer than any
# call can last here (one attempt's request timeout; timeouts are not retried), so a worker cut off from
# PostgreSQL mid-call cannot charge after another worker's search found nothing.
NEW_KEY_QUIET_S = 2 * STRIPE_REQUEST_TIMEOUT_S
PG_BACKOFF_MAX_S = 5  # pg::pool_options::backoff_max (not a flag)
RESTART_DELAY_S = 1.0
CUT_S = (2.0, 10.0)
CUT_EVERY_S = (1.0, 4.0)
KILL_EVERY_S = (4.0, 10.0)


def quiescence_bound():
    """Seconds after the last heal by which everything must have settled.

    A delivery stuck on a cut or killed worker is redelivered after --msg-timeout; a lease it held expires
    after --lease (an abandoned renewal cannot extend it: that is one of the fixes under test); the pool
    reconnects on demand, at worst after its backoff; a Stripe call in flight ends within the request
    timeout; recovery then needs a few requeues (lease held → take → search → charge), each
    REQUEUE_DELAY_S, and a new key generation waits NEW_KEY_QUIET_S after the last call under the old one.
    Add a restart (--migrate, connect) and slack for a loaded 2-core CI machine.
    """
    chain = (MSG_TIMEOUT_S + LEASE_S + PG_BACKOFF_MAX_S + STRIPE_REQUEST_TIMEOUT_S + 4 * REQUEUE_DELAY_S +
             NEW_KEY_QUIET_S)
    return chain + 20


def log(msg):
    print("partition: " + msg, flush=True)


def free_port(ip):
    s = socket.socket()
    s.bind((ip, 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Cleanup:
    """Everything to undo, in reverse order; run once (atexit, SIGTERM, or the end of main)."""

    def __init__(self):
        self.steps = []
        self.done = False

    def add(self, fn):
        self.steps.append(fn)

    def run(self):
        if self.done:
            return
        self.done = True
        for fn in reversed(self.steps):
            try:
                fn()
            except Exception as e:  # keep removing the rest
                print("partition: cleanup step failed: %s" % e, file=sys.stderr)


class Postgres:
    """A throwaway cluster (ci/pg-cluster initdb) listening on loopback and the bridge address."""

    def __init__(self, ctl, work, host_ip, subnet):
        self.ctl, self.dir, self.host_ip = ctl, os.path.join(work, "pg"), host_ip
        os.makedirs(self.dir)
        os.chmod(work, 0o755)
        os.chmod(self.dir, 0o755)
        self.port = free_port("127.0.0.1")
        subprocess.run([ctl, "start", self.dir, str(self.port)], check=True)
        subprocess.run([ctl, "stop", self.dir], check=True)
        with open(os.path.join(self.dir, "data", "pg_hba.conf"), "a") as f:
            f.write("host all all %s trust\n" % subnet)
        self.bin = "/usr/lib/postgresql/15/bin"
        self._pg_ctl("start", "-w", "-t", "60", "-l", os.path.join(self.dir, "server.log"), "-o",
                     "-c listen_addresses=127.0.0.1,%s -p %d -k %s -c fsync=off -c max_connections=200"
                     % (host_ip, self.port, os.path.join(self.dir, "sock")))

    def _pg_ctl(self, *args):
        cmd = [os.path.join(self.bin, "pg_ctl"), "-D", os.path.join(self.dir, "data")] + list(args)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        subprocess.run(cmd, check=True, cwd="/", stdout=subprocess.DEVNULL)

    def stop(self):
        self._pg_ctl("stop", "-m", "immediate", "-w")

    def psql(self, db, sql):
        cmd = ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", db, "-qAtX",
               "-F", "\t", "-c", sql]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        if r.returncode != 0:
            raise RuntimeError("psql: " + r.stderr.strip())
        return [l.split("\t") for l in r.stdout.splitlines() if l]


def make_pki(work, host_ip):
    d = os.path.join(work, "pki")
    os.makedirs(d)
    run = lambda *a: subprocess.run(list(a), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-days", "2", "-subj", "/CN=partition test CA", "-keyout", d + "/ca.key", "-out", d + "/ca.pem",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-subj", "/CN=" + host_ip, "-keyout", d + "/server.key", "-out", d + "/server.csr")
    with open(d + "/ext.cnf", "w") as f:
        f.write("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                "extendedKeyUsage=serverAuth\nsubjectAltName=IP:%s\n" % host_ip)
    run("openssl", "x509", "-req", "-in", d + "/server.csr", "-CA", d + "/ca.pem", "-CAkey", d + "/ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", d + "/ext.cnf", "-out", d + "/server.pem")
    return d


def wait_listening(ip, port, proc, what, limit=20):
    until = time.monotonic() + limit
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise RuntimeError("%s exited with %s" % (what, proc.returncode))
        try:
            socket.create_connection((ip, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("%s did not listen on %s:%d" % (what, ip, port))


class _Ledger:
    """What chaos.check reads the ledger through."""

    def __init__(self, pg, db):
        self.pg, self.db = pg, db

    def query(self, sql):
        return self.pg.psql(self.db, sql)


class _Stripe:
    def __init__(self, seed):
        self.seed = seed

    def charges(self):
        return self.seed.stripe_admin("/_admin/charges")["data"]

    def intents(self):
        return self.seed.stripe_admin("/_admin/intents")["data"]


class Seed:
    """One seeded run: fresh database, nsqd and fake-stripe; the namespaces and PostgreSQL are shared."""

    def __init__(self, args, net, pg, pki, seed, work):
        self.args, self.net, self.pg, self.pki, self.seed = args, net, pg, pki, seed
        self.rng = random.Random(seed)
        self.work = os.path.join(work, "seed-%d" % seed)
        os.makedirs(self.work)
        self.db = "partition_%d" % seed
        self.procs = []  # every process we started, for cleanup
        self.workers = [None] * WORKERS
        self.worker_logs = [os.path.join(self.work, "consume-%d.log" % i) for i in range(WORKERS)]
        self.stats = {"cuts": 0, "cuts_by": {}, "kills": 0, "exits": 0, "published": 0}
        self.exited_at = {}  # worker → when it exited on its own (restarted RESTART_DELAY_S later)
        self.exit_codes = {}

    # ---- services -----------------------------------------------------------------------------------

    def start_services(self):
        host = self.net.host_ip
        self.pg.psql("postgres", "DROP DATABASE IF EXISTS %s" % self.db)
        self.pg.psql("postgres", "CREATE DATABASE %s" % self.db)
        self.nsqd_tcp, self.nsqd_http = free_port(host), free_port(host)
        nsqd_log = open(os.path.join(self.work, "nsqd.log"), "w")
        if os.environ.get("NSQD_BIN"):
            data = os.path.join(self.work, "nsqd-data")
            os.makedirs(data)
            cmd = [os.environ["NSQD_BIN"], "--tcp-address", "%s:%d" % (host, self.nsqd_tcp),
                   "--http-address", "%s:%d" % (host, self.nsqd_http), "--broadcast-address", host,
                   "--data-path", data, "--msg-timeout", "%ds" % MSG_TIMEOUT_S]
            self.nsqd_kind = "nsqd 1.3.0"
        else:
            cmd = [self.args.fake_nsqd, "--tcp-address", "%s:%d" % (host, self.nsqd_tcp),
                   "--http-address", "%s:%d" % (host, self.nsqd_http),
                   "--msg-timeout-ms", str(MSG_TIMEOUT_S * 1000)]
            self.nsqd_kind = "fake-nsqd"
        self.nsqd = self.spawn(cmd, nsqd_log)
        wait_listening(host, self.nsqd_tcp, self.nsqd, "nsqd")
        wait_listening(host, self.nsqd_http, self.nsqd, "nsqd http")
        self.stripe_port = free_port(host)
        self.stripe = self.spawn([self.args.fake_stripe, "--listen", "%s:%d" % (host, self.stripe_port),
                                  "--cert", self.pki + "/server.pem", "--key", self.pki + "/server.key"],
                                 open(os.path.join(self.work, "fake-stripe.log"), "w"))
        wait_listening(host, self.stripe_port, self.stripe, "fake-stripe")
        # Charges take a while, so cuts and kills land while calls are in flight.
        self.stripe_admin("/_admin/faults", {"latency_ms": "300", "latency_jitter_ms": "1500"})
        # Create the topic and channel before anyone publishes, so no message waits for a subscriber.
        self.nsqd_http_post("/topic/create?topic=" + TOPIC)
        self.nsqd_http_post("/channel/create?topic=%s&channel=%s" % (TOPIC, CHANNEL))

    def spawn(self, cmd, out, env=None):
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd="/",
                             start_new_session=True)
        self.procs.append(p)
        return p

    def stripe_admin(self, path, form=None):
        ctx = ssl.create_default_context(cafile=self.pki + "/ca.pem")
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        req = urllib.request.Request("https://%s:%d%s" % (self.net.host_ip, self.stripe_port, path), data=data,
                                     headers={"Authorization": "Bearer " + STRIPE_KEY})
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return json.loads(r.read().decode())

    def nsqd_http_post(self, path):
        req = urllib.request.Request("http://%s:%d%s" % (self.net.host_ip, self.nsqd_http, path), data=b"")
        try:
            urllib.request.urlopen(req, timeout=5).read()
        except urllib.error.HTTPError:
            pass  # fake-nsqd may not serve the create endpoints: it creates on first use

    def channel_backlog(self):
        """(depth, in_flight, deferred) of our channel, or None when nsqd does not say."""
        url = "http://%s:%d/stats?format=json&topic=%s" % (self.net.host_ip, self.nsqd_http, TOPIC)
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                st = json.loads(r.read().decode())
        except Exception:
            return None
        st = st.get("data", st)
        for t in st.get("topics", []):
            if t.get("topic_name") != TOPIC:
                continue
            for c in t.get("channels", []):
                if c.get("channel_name") == CHANNEL:
                    return (c.get("depth", 0), c.get("in_flight_count", 0), c.get("deferred_count", 0))
        return None

    # ---- consumers ----------------------------------------------------------------------------------

    def start_worker(self, i):
        host = self.net.host_ip
        cmd = self.net.exec_prefix(i) + [
            self.args.chargeguard, "consume", "--topic", TOPIC, "--channel", CHANNEL,
            "--nsqd-tcp-address", "%s:%d" % (host, self.nsqd_tcp),
            "--pg-dsn", "host=%s port=%d user=postgres dbname=%s connect_timeout=3" % (host, self.pg.port, self.db),
            "--migrate", "--pg-query-timeout", str(PG_QUERY_TIMEOUT_S),
            "--stripe-api-base", "https://%s:%d" % (host, self.stripe_port),
            "--stripe-ca-file", self.pki + "/ca.pem",
            "--stripe-connect-timeout", "3", "--stripe-request-timeout", str(STRIPE_REQUEST_TIMEOUT_S),
            "--stripe-retry-initial", "0.2", "--stripe-retry-max", "1",
            "--key-namespace", KEY_NAMESPACE, "--max-in-flight", "20",
            "--msg-timeout", "%ds" % MSG_TIMEOUT_S, "--heartbeat-interval", "1s",
            "--lease", "%ds" % LEASE_S, "--lease-renew-interval", "%ds" % RENEW_S,
            "--lease-held-delay", "%ds" % REQUEUE_DELAY_S, "--retry-same-key-delay", "%ds" % REQUEUE_DELAY_S,
            "--indeterminate-delay", "%ds" % REQUEUE_DELAY_S, "--search-failed-delay", "%ds" % REQUEUE_DELAY_S,
            "--new-key-quiet", "%ds" % NEW_KEY_QUIET_S, "--max-attempts", "1000", "--health-listen", "127.0.0.1:0", "--shutdown-timeout", "3",
            "--max-loop-lag", "5"]
        env = dict(os.environ, STRIPE_API_KEY=STRIPE_KEY)
        out = open(self.worker_logs[i], "a")
        self.workers[i] = self.spawn(cmd, out, env=env)

    def supervise(self):
        """Restarts consumers that exited on their own (e.g. --migrate while cut off from PostgreSQL) after
        RESTART_DELAY_S, like a supervisor's restart backoff (a link-down cut fails a start at once)."""
        now = time.monotonic()
        for i, p in enumerate(self.workers):
            if p is None or p.poll() is None:
                continue
            if i not in self.exited_at:
                self.exited_at[i] = now
                self.stats["exits"] += 1
                self.exit_codes[p.returncode] = self.exit_codes.get(p.returncode, 0) + 1
            elif now - self.exited_at[i] >= RESTART_DELAY_S:
                del self.exited_at[i]
                self.start_worker(i)

    def kill_worker(self, i):
        p = self.workers[i]
        if p and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
        elif i in self.exited_at:
            return  # already down, waiting for its restart
        self.stats["kills"] += 1
        self.start_worker(i)

    # ---- events ---------------------------------------------------------------------------------------

    def make_events(self, n):
        """`n` valid events (one per customer, chaos.PERIOD, as chaos.check expects them) and a few invalid
        lines, which must be dead-lettered (a dead letter for anything else is a false one)."""
        valid = []
        for k in range(n):
            customer = "part-%d-%d" % (self.seed, k)
            scus = "cus_%d_%d" % (self.seed, k)
            body = json.dumps({"customer_id": customer, "billing_period": chaos.PERIOD, "amount_cents": 100 + k,
                               "currency": "usd", "stripe_customer_id": scus,
                               "description": "partition seed %d event %d" % (self.seed, k)})
            valid.append(chaos.Event(customer, scus, 100 + k, "charged", False, None, body))
        invalid = ['{"customer_id":"part-%d-bad","billing_period":"%s","amount_cents":"12","currency":"usd",'
                   '"stripe_customer_id":"cus_x"}' % (self.seed, chaos.PERIOD),
                   '{"customer_id":"part-%d-missing"}' % self.seed]
        return valid, invalid

    def publish(self, lines):
        path = os.path.join(self.work, "batch-%d.jsonl" % self.stats["published"])
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        r = subprocess.run([self.args.chargeguard, "publish", "--no-validate", "--nsqd-tcp-address",
                            "%s:%d" % (self.net.host_ip, self.nsqd_tcp), "--topic", TOPIC, path],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise RuntimeError("publish failed: " + r.stdout[-500:])
        self.stats["published"] += len(lines)

    # ---- the run --------------------------------------------------------------------------------------

    def chaos(self, lines):
        """Publishes `lines` (plus exact duplicates) over the first 2/3 of the chaos window while cutting
        and killing; returns when the window ends with every cut healed."""
        dups = [e for e in lines if self.rng.random() < 0.25]
        stream = lines + dups
        self.rng.shuffle(stream)
        window = self.args.chaos
        start = time.monotonic()
        publish_until = start + window * 2 / 3
        batches = max(1, int(window * 2 / 3))
        per_batch = max(1, -(-len(stream) // batches))
        next_cut = start + self.rng.uniform(*CUT_EVERY_S)
        next_kill = start + self.rng.uniform(*KILL_EVERY_S)
        next_publish = start
        heal_at = {}  # worker → monotonic time
        deps = {"postgres": self.pg.port, "nsqd": self.nsqd_tcp, "stripe": self.stripe_port}
        while True:
            now = time.monotonic()
            if now >= start + window and not stream:
                break
            for i, t in list(heal_at.items()):
                if now >= t:
                    self.net.heal(i)
                    del heal_at[i]
            if stream and now >= next_publish:
                self.publish(stream[:per_batch])
                stream = stream[per_batch:]
                next_publish = now + 1.0 if now < publish_until else now
            if now < start + window and now >= next_cut:
                free = [i for i in range(WORKERS) if i not in heal_at]
                if free:
                    i = self.rng.choice(free)
                    what = self.rng.choice(["postgres", "nsqd", "stripe", "everything"])
                    if what == "everything":
                        self.net.cut_all(i)
                    else:
                        self.net.cut_port(i, deps[what])
                    heal_at[i] = now + self.rng.uniform(*CUT_S)
                    self.stats["cuts"] += 1
                    self.stats["cuts_by"][what] = self.stats["cuts_by"].get(what, 0) + 1
                next_cut = now + self.rng.uniform(*CUT_EVERY_S)
            if now < start + window and now >= next_kill:
                self.kill_worker(self.rng.randrange(WORKERS))
                next_kill = now + self.rng.uniform(*KILL_EVERY_S)
            self.supervise()
            time.sleep(0.05)
        for i in list(heal_at):
            self.net.heal(i)

    def check(self, valid, invalid):
        """Problems that remain now ([] when quiescent and exactly once). The exactly-once and dead-letter
        assertions are chaos.check's; quiescence adds nsqd's channel and the ledger's pending rows."""
        report = {"failures": []}
        chaos.check(report, valid, invalid, _Ledger(self.pg, self.db), _Stripe(self))
        problems = list(report["failures"])
        if report.get("duplicates"):
            problems.insert(0, "TWICE: %d events charged more than once" % report["duplicates"])
        false_letters = [p for p in problems if "was dead-lettered" in p]
        if false_letters:
            problems.insert(0, "FALSE DEAD LETTER: %d valid events dead-lettered" % len(false_letters))
        pending = self.pg.psql(self.db, "SELECT count(*) FROM billing_records WHERE status = 'pending'")[0][0]
        if pending != "0":
            problems.append("%s ledger rows still pending" % pending)
        backlog = self.channel_backlog()
        if backlog is not None and any(backlog):
            problems.append("nsqd channel not drained: depth %d, in flight %d, deferred %d" % backlog)
        return problems

    def stale_backoff_failures(self):
        """Ledger steps that failed at once on the pool's reconnect backoff ("next connection attempt in …")
        instead of connecting on demand: the ledger must wait (bounded) for a working connection, so a settle
        after a charge never fails on a stale "down" (issue 15, item 2)."""
        out = []
        for path in self.worker_logs:
            for entry in chaos.read_log(path):
                if "step" in entry and "next connection attempt in" in str(entry.get("error", "")):
                    out.append("%s: %s" % (entry.get("step"), entry.get("billing_key")))
        return out

    def run(self):
        self.start_services()
        for i in range(WORKERS):
            self.start_worker(i)
        valid, invalid = self.make_events(self.args.events)
        began = time.monotonic()
        self.chaos([v.body for v in valid] + invalid)
        healed = time.monotonic()
        bound = quiescence_bound()
        problems = ["not checked"]
        while time.monotonic() < healed + bound:
            self.supervise()
            try:
                problems = self.check(valid, invalid)
            except Exception as e:  # a transient read failure is not a verdict
                problems = ["check failed: %s" % e]
            if not problems:
                break
            # Never twice is final: no amount of waiting undoes a double charge.
            if any(p.startswith(("TWICE", "FALSE DEAD LETTER")) for p in problems):
                break
            time.sleep(0.5)
        settle = time.monotonic() - healed
        stale = self.stale_backoff_failures()
        if stale:
            problems = ["STALE BACKOFF: %d ledger steps failed on the pool's reconnect backoff, e.g. %s"
                        % (len(stale), stale[:3])] + problems
        s = self.stats
        summary = ("seed %d (%s): %d events + %d duplicates/invalid, %d cuts %s, %d kills, %d exits %s restarted; "
                   "chaos %.0f s; " % (self.seed, self.nsqd_kind, len(valid), s["published"] - len(valid),
                                       s["cuts"], json.dumps(s["cuts_by"], sort_keys=True), s["kills"],
                                       s["exits"], json.dumps(self.exit_codes), healed - began))
        if problems:
            log(summary + "FAILED after %.1f s (bound %d s): %d problems" % (settle, bound, len(problems)))
            for p in problems[:20]:
                log("  " + p)
            for i, path in enumerate(self.worker_logs):
                with open(path, errors="replace") as f:
                    tail = f.read()[-3000:]
                log("---- consume %d log tail ----\n%s" % (i, tail))
            return False
        log(summary + "quiescent %.1f s after the last heal (bound %d s): exactly once, only the invalid lines dead-lettered"
            % (settle, bound))
        return True

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()


def parse_seeds(text):
    out = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += list(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--chaos", type=float, default=30.0, help="seconds of cuts and kills per seed")
    ap.add_argument("--events", type=int, default=40, help="distinct events per seed")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--chargeguard", default=os.environ.get("CHARGEGUARD_EXE"))
    ap.add_argument("--fake-stripe", default=os.environ.get("FAKE_STRIPE_EXE"))
    ap.add_argument("--fake-nsqd", default=os.environ.get("FAKE_NSQD_EXE"))
    ap.add_argument("--pg-cluster", default=os.environ.get("PG_CLUSTER"))
    args = ap.parse_args()

    for name in ("chargeguard", "fake_stripe", "fake_nsqd", "pg_cluster"):
        if not getattr(args, name) or not os.path.exists(getattr(args, name)):
            print("skipped: %s not found (set %s)" % (name, name.upper()))
            return 77
    try:
        netns.check_available()
    except netns.Unavailable as e:
        print("skipped: network namespaces unavailable: %s" % e)
        return 77

    cleanup = Cleanup()
    atexit.register(cleanup.run)

    def on_signal(signum, _frame):
        # Once: a second SIGTERM (timeout(1) forwards one, meson may send another) must not cut the
        # cleanup short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cleanup.run()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    work = tempfile.mkdtemp(prefix="cg-partition.")
    if not args.keep:
        cleanup.add(lambda: shutil.rmtree(work, ignore_errors=True))
    net = netns.Net(WORKERS)
    cleanup.add(net.close)
    net.up()
    subnet = "10.231.%d.0/24" % net.octet
    pg = Postgres(args.pg_cluster, work, net.host_ip, subnet)
    cleanup.add(pg.stop)
    pki = make_pki(work, net.host_ip)
    log("bridge %s on %s, PostgreSQL :%d, %d consumers, quiescence bound %d s"
        % (net.bridge, net.host_ip, pg.port, WORKERS, quiescence_bound()))

    results = {}
    for seed in parse_seeds(args.seeds):
        s = Seed(args, net, pg, pki, seed, work)
        cleanup.add(s.stop)  # also on SIGTERM mid-seed (idempotent)
        try:
            results[seed] = s.run()
        except Exception as e:
            log("seed %d: ERROR %s" % (seed, e))
            results[seed] = False
        finally:
            s.stop()
            for i in range(WORKERS):
                net.heal(i)
    cleanup.run()
    left = net.leftovers()
    if left:
        log("LEFT BEHIND: %s" % left)
    failed = [s for s, ok in results.items() if not ok]
    log("%d seeds, %d passed, %d failed%s" % (len(results), len(results) - len(failed), len(failed),
                                              (" (seeds %s)" % failed) if failed else ""))
    return 1 if failed or left else 0


if __name__ == "__main__":
    sys.exit(main())
