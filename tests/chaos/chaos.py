#!/usr/bin/env python3
"""Chaos test: exactly once — never twice AND never zero times — under crashes, restarts and Stripe faults.

Real processes only: several `chargeguard consume` sharing one PostgreSQL ledger (a throwaway cluster of
its own), nsqd (the real 1.3.0 daemon from NSQD_BIN when set, else fake-nsqd), fake-stripe over HTTPS.
For each seed:
  * a billing run: valid events (some for customers whose cards are declined) and invalid lines, each
    valid event published 1–3 times at random moments (producer re-publishes); about 30 % of the valid
    events carry a `payment_method` and are charged through confirmed PaymentIntents (off_session given as
    true, false or left to its default), some for customers whose card needs authentication (on-session:
    the intent stops at requires_action with no charge; off-session: 402 authentication_required);
  * chaos for --duration seconds: a consumer SIGKILLed and restarted every 0.5–3 s, PostgreSQL restarted
    once, nsqd restarted once with messages in flight (SIGTERM, same data path — real nsqd only: fake-nsqd
    keeps messages in memory, so its restart would lose them, which a real broker does not), and Stripe
    answering 500 after creating, dropping the connection after creating, 429, and one stall longer than
    msg_timeout;
  * then the chaos stops and the surviving consumers must reach quiescence (channel empty, nothing in
    flight or deferred, no `pending` ledger row) within a bound derived from the configured timings;
  * assertions: every valid event has exactly one succeeded charge at Stripe and its ledger row is
    `charged` with that charge id; declined customers have no succeeded charge and are `declined`; every
    invalid line is in `dead_letters` and no valid event is. A PaymentIntent event has exactly one intent
    at Stripe (never two for one key, none missing, none for a /v1/charges event): charged → the intent
    succeeded, its latest_charge is the key's one succeeded charge and points back at it, and the ledger
    row records both ids; declined (card or authentication) → no succeeded charge, at most the intent's
    one failed charge, the row `declined` with the intent's id. --connect-share of the customers are
    charged on behalf of two Stripe Connect accounts (`stripe_account`), the same customer id on both: each
    account's event is its own key and row and must have its charge and intent in its own account, once.
The Stripe faults (500 after create, drop after create, 429, the stall) hit /v1/payment_intents as well as
/v1/charges; fake-stripe counts the hits per endpoint and each seed prints them.
Each SIGKILL is classified by the step the killed worker's deliveries had reached (its own debug log,
cross-checked with the ledger and Stripe state right after the kill): before the ledger write, between it
and the Stripe call, during the call, between Stripe's answer and the ledger update, between the update and
FIN. The totals are printed; a failing seed is printed with the command that replays it.

Usage: chaos.py --build DIR [--seeds N | --seed S] [--events N] [--profile short|scaled|both] ...
Exit status 0 when every seed held, 1 otherwise, 77 when the run cannot be set up here (skipped).
"""
import argparse
import collections
import hashlib
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
import urllib.error
import urllib.parse
import urllib.request
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PG_BIN = "/usr/lib/postgresql/15/bin"  # as ci/pg-cluster
TOPIC, CHANNEL, NAMESPACE, PERIOD = "billing", "chargeguard", "chaos", "2026-11"

# Two timing profiles: the short timings of the original chaos report, and the defaults (60 s msg-timeout
# and lease, 15 s renewal, 10 s lease-held, 5 s retry, 30 s indeterminate and search-failed) scaled by 1/10.
PROFILES = {
    "short": dict(msg_timeout=5.0, lease=6.0, renew=1.0, held=1.0, retry=1.0, indeterminate=1.0, search=1.0),
    "scaled": dict(msg_timeout=6.0, lease=6.0, renew=1.5, held=1.0, retry=0.5, indeterminate=3.0, search=3.0),
}
WINDOWS = ["before_ledger_write", "between_write_and_call", "during_call", "between_answer_and_update",
           "between_update_and_fin"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def billing_key(customer, account=None):
    """billing/machine/key.cpp: the platform's key, or with ":<account>" hashed in for a Stripe Connect event."""
    tail = f":{account}" if account else ""
    return hashlib.sha256(f"{NAMESPACE}:{customer}:{PERIOD}{tail}".encode()).hexdigest()[:32]


# Stripe Connect: a share of the events charge on behalf of one of two connected accounts, each such customer
# id charged on both accounts (the same customer id and period: two keys, two charges, each in its account).
CONNECT_ACCOUNTS = ("acct_1ChaosA", "acct_1ChaosB")


def wait_until(pred, timeout, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return True
        except Exception:
            pass
        time.sleep(step)
    return False


class Postgres:
    """A throwaway cluster of this run's own (ci/pg-cluster), so restarting it disturbs no other test."""

    def __init__(self, work):
        self.dir = os.path.join(work, "pg")
        os.makedirs(self.dir)
        os.chmod(work, 0o755)
        os.chmod(self.dir, 0o755)
        self.port = free_port()
        self.ctl = os.path.join(ROOT, "ci", "pg-cluster")
        subprocess.run([self.ctl, "start", self.dir, str(self.port)], check=True)
        self.env = dict(os.environ, PGHOST="127.0.0.1", PGPORT=str(self.port), PGUSER="postgres",
                        PGDATABASE="chargeguard_test", PGCONNECT_TIMEOUT="5")

    def restart(self):
        subprocess.run([self.ctl, "restart", self.dir], check=True, stdout=subprocess.DEVNULL)

    def stop(self):
        subprocess.run([self.ctl, "stop", self.dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query(self, sql, retries=50):
        for i in range(retries):
            r = subprocess.run(["psql", "-X", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c", sql],
                               env=self.env, capture_output=True, text=True, cwd="/")
            if r.returncode == 0:
                return [line.split("\t") for line in r.stdout.splitlines() if line]
            time.sleep(0.1)
        raise RuntimeError(f"psql failed: {r.stderr.strip()}")


class Standby:
    """A streaming standby of `primary` (pg_basebackup -R), for --failover: held behind by clearing its
    primary_conninfo (the walreceiver disconnects, so nothing the primary commits afterwards reaches it),
    then the primary is SIGKILLed and the standby promoted. With `sync` the primary waits for it
    (synchronous_standby_names set on the primary only, after the copy)."""

    def __init__(self, work, primary, sync):
        self.primary = primary
        self.dir = os.path.join(work, "pg-standby")
        os.makedirs(os.path.join(self.dir, "sock"))
        os.chmod(self.dir, 0o755)
        self.port = free_port()
        with open(os.path.join(self.dir, "port"), "w") as f:
            f.write(str(self.port))
        open(os.path.join(self.dir, "roles-done"), "w").close()  # the roles come with the copy
        with open(os.path.join(primary.dir, "data", "pg_hba.conf"), "a") as f:
            f.write("host replication all 127.0.0.1/32 trust\n")
        primary.query("SELECT pg_reload_conf()")
        if os.getuid() == 0:
            subprocess.run(["chown", "-R", "postgres:postgres", self.dir], check=True)
        self.as_pg([PG_BIN + "/pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                    "-D", os.path.join(self.dir, "data"), "-R", "-X", "stream", "-c", "fast"])
        subprocess.run([primary.ctl, "start", self.dir], check=True)
        self.env = dict(primary.env, PGPORT=str(self.port))
        if sync:
            primary.query("ALTER SYSTEM SET synchronous_standby_names = '*'")
            primary.query("SELECT pg_reload_conf()")
        if not wait_until(lambda: primary.query("SELECT count(*) FROM pg_stat_replication")[0][0] == "1", 30):
            raise RuntimeError("the standby did not start streaming")

    @staticmethod
    def as_pg(args):
        if os.getuid() == 0:
            args = ["runuser", "-u", "postgres", "--"] + args
        subprocess.run(args, check=True, cwd="/", stdout=subprocess.DEVNULL)

    def query(self, sql):
        r = subprocess.run(["psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql], env=self.env,
                           capture_output=True, text=True, cwd="/")
        if r.returncode != 0:
            raise RuntimeError(f"psql on the standby failed: {r.stderr.strip()}")
        return r.stdout.strip()

    def hold(self):
        self.query("ALTER SYSTEM SET primary_conninfo = ''")
        self.query("SELECT pg_reload_conf()")

    def fail_over(self):
        """SIGKILL the primary's postmaster (its backends die with it), promote the standby, and point the
        harness's queries at it. Returns the WAL bytes the standby never received."""
        lost = None
        try:
            lost = int(self.primary.query("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn", retries=1)[0][0]) - \
                int(self.query("SELECT coalesce(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()) - '0/0'::pg_lsn"))
        except Exception:
            pass
        with open(os.path.join(self.primary.dir, "data", "postmaster.pid")) as f:
            os.kill(int(f.readline()), signal.SIGKILL)
        self.as_pg([PG_BIN + "/pg_ctl", "-D", os.path.join(self.dir, "data"), "-w", "promote"])
        self.primary.dir, self.primary.port, self.primary.env = self.dir, self.port, self.env
        return lost


class Nsqd:
    def __init__(self, work, build, nsqd_bin):
        self.real = bool(nsqd_bin)
        self.bin = nsqd_bin or os.path.join(build, "tests", "doubles", "nsq", "fake-nsqd")
        self.tcp, self.http = free_port(), free_port()
        self.data = os.path.join(work, "nsqd-data")
        os.makedirs(self.data)
        self.logf = open(os.path.join(work, "nsqd.log"), "ab")
        self.proc = None
        self.start()

    def start(self):
        if self.real:
            args = [self.bin, f"--tcp-address=127.0.0.1:{self.tcp}", f"--http-address=127.0.0.1:{self.http}",
                    f"--data-path={self.data}", "--broadcast-address=127.0.0.1", "--log-level=warn"]
        else:
            args = [self.bin, "--tcp-address", f"127.0.0.1:{self.tcp}", "--http-address",
                    f"127.0.0.1:{self.http}", "--msg-timeout-ms", "60000"]
        self.proc = subprocess.Popen(args, stdout=self.logf, stderr=self.logf)
        if not wait_until(lambda: urllib.request.urlopen(self.url("/ping"), timeout=1).status == 200, 20):
            raise RuntimeError("nsqd did not start")
        # The topic and channel exist before anything is published, so nothing published early is lost to a
        # channel that did not exist yet.
        for path in (f"/topic/create?topic={TOPIC}", f"/channel/create?topic={TOPIC}&channel={CHANNEL}"):
            req = urllib.request.Request(self.url(path), data=b"", method="POST")
            try:
                urllib.request.urlopen(req, timeout=5).read()
            except urllib.error.HTTPError:
                pass

    def url(self, path):
        return f"http://127.0.0.1:{self.http}{path}"

    def restart(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.start()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def publish(self, bodies):
        """MPUB, retried until nsqd has the batch (a restart is a blip for a producer, not a loss; a retried
        batch may be published twice, which is one more producer re-publish)."""
        data = "\n".join(bodies).encode()
        while True:
            try:
                req = urllib.request.Request(self.url(f"/mpub?topic={TOPIC}"), data=data, method="POST")
                if urllib.request.urlopen(req, timeout=5).status == 200:
                    return
            except Exception:
                pass
            time.sleep(0.1)

    def channel_stats(self):
        with urllib.request.urlopen(self.url(f"/stats?format=json&topic={TOPIC}"), timeout=5) as r:
            st = json.load(r)
        st = st.get("data", st)
        for t in st.get("topics") or []:
            if t.get("topic_name") != TOPIC:
                continue
            for c in t.get("channels") or []:
                if c.get("channel_name") == CHANNEL:
                    return dict(topic_depth=t.get("depth", 0), depth=c.get("depth", 0),
                                in_flight=c.get("in_flight_count", 0), deferred=c.get("deferred_count", 0),
                                timeouts=c.get("timeout_count", 0), requeues=c.get("requeue_count", 0))
        return None


WEBHOOK_SECRET = "whsec_chaos_endpoint_secret"
# Bank debits stay processing this long at fake-stripe; the consumers poll rows processing longer than
# POLL_AFTER_S (so a webhook lost for good, or given up, still ends the row).
SETTLE_AFTER_MS = 1500
POLL_AFTER_S = 4.0


class Stripe:
    def __init__(self, work, build, declined, auth_required=(), webhook_url=None, webhook_faults=(0, 0)):
        self.pki = os.path.join(work, "pki")
        subprocess.run(["sh", os.path.join(ROOT, "tests", "doubles", "stripe", "gen-test-certs.sh"), self.pki],
                       check=True)
        self.port = free_port()
        args = [os.path.join(build, "tests", "doubles", "stripe", "fake-stripe"), "--listen",
                f"127.0.0.1:{self.port}", "--cert", os.path.join(self.pki, "server.pem"), "--key",
                os.path.join(self.pki, "server.key")]
        for c in declined:
            args += ["--decline", c]
        if webhook_url:
            # Stripe's delivery: signed, retried on non-2xx with backoff, some events twice, some held back
            # behind a later event about the same payment.
            dup, reorder = webhook_faults
            args += ["--webhook-url", webhook_url, "--webhook-secret", WEBHOOK_SECRET,
                     "--settle-after-ms", str(SETTLE_AFTER_MS), "--webhook-duplicate-pct", str(dup),
                     "--webhook-reorder-pct", str(reorder), "--webhook-reorder-hold-ms", "2500",
                     "--webhook-retry-base-ms", "250", "--webhook-retry-max-ms", "2000",
                     "--webhook-max-attempts", "8"]
        self.logf = open(os.path.join(work, "fake-stripe.log"), "ab")
        self.proc = subprocess.Popen(args, stdout=self.logf, stderr=self.logf)
        self.ctx = ssl.create_default_context(cafile=os.path.join(self.pki, "ca.pem"))
        if not wait_until(lambda: self.admin("GET", "/_admin/charges") is not None, 20):
            raise RuntimeError("fake-stripe did not start")
        for c in auth_required:
            self.admin("POST", "/_admin/declines", {"customer": c, "code": "authentication_required"})

    def connect(self, account, customers):
        self.admin("POST", "/_admin/accounts", {"account": account, "customers": ",".join(customers)})

    def admin(self, method, path, form=None):
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        req = urllib.request.Request(f"https://127.0.0.1:{self.port}{path}", data=data, method=method)
        with urllib.request.urlopen(req, timeout=10, context=self.ctx) as r:
            return json.load(r)

    def faults(self, **kw):
        self.admin("POST", "/_admin/faults", {k: str(v) for k, v in kw.items()})

    def charges(self):
        return self.admin("GET", "/_admin/charges")["data"]

    def intents(self):
        return self.admin("GET", "/_admin/intents")["data"]

    def fault_hits(self):
        return self.admin("GET", "/_admin/stats").get("fault_hits", {})

    def refunds(self, account=None):
        """Every refund of the platform, or of a connected account (Stripe-Account), through the API (GET
        /v1/refunds, newest first, paged); each tagged with the account it was listed in ("_account")."""
        out, after = [], None
        headers = {"Authorization": "Bearer sk_test_chaos"}
        if account:
            headers["Stripe-Account"] = account
        while True:
            path = "/v1/refunds?limit=100" + (f"&starting_after={after}" if after else "")
            req = urllib.request.Request(f"https://127.0.0.1:{self.port}{path}", headers=headers)
            with urllib.request.urlopen(req, timeout=10, context=self.ctx) as r:
                page = json.load(r)
            out += [dict(one, _account=account or "") for one in page["data"]]
            if not page.get("has_more") or not page["data"]:
                return out
            after = page["data"][-1]["id"]

    def posts_for(self, key):
        return self.admin("GET", f"/_admin/posts?key={key}")["count"]

    def deliveries(self):
        return self.admin("GET", "/_admin/webhooks/deliveries")

    def webhooks_idle(self, timeout_s):
        try:
            self.admin("GET", f"/_admin/webhooks/wait?idle=1&timeout_ms={int(timeout_s * 1000)}")
            return True
        except urllib.error.HTTPError:
            return False

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


class Webhooks:
    """`chargeguard webhooks`: Stripe's deliveries land here and settle the ledger's processing rows."""

    def __init__(self, work, build, pg):
        self.cg = os.path.join(build, "src", "app", "chargeguard")
        self.work, self.pg = work, pg
        self.port = free_port()
        self.proc = None
        self.incarnation = 0
        self.dsn = None  # --failover: both hosts, as the consumers have
        self.start()

    def url(self):
        return f"http://127.0.0.1:{self.port}/stripe/webhooks"

    def log_path(self):
        return os.path.join(self.work, f"webhooks-{self.incarnation}.log")

    def start(self):
        self.incarnation += 1
        path = os.path.join(self.work, f"webhooks-{self.incarnation}.log")
        env = dict(self.pg.env, CHARGEGUARD_WEBHOOK_SECRET=WEBHOOK_SECRET)
        with open(path, "wb") as f:
            self.proc = subprocess.Popen([self.cg, "--log-level", "info", "webhooks", "--listen",
                                          f"127.0.0.1:{self.port}", "--health-listen", "127.0.0.1:0",
                                          "--migrate", *(["--pg-dsn", self.dsn] if self.dsn else [])],
                                         stdout=subprocess.DEVNULL, stderr=f, env=env)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

class Consumers:
    def __init__(self, work, build, nsqd, pg, stripe, prof, count, max_in_flight):
        self.cg = os.path.join(build, "src", "app", "chargeguard")
        self.work, self.nsqd, self.pg, self.stripe, self.prof = work, nsqd, pg, stripe, prof
        self.procs = [None] * count
        self.logs = [None] * count
        self.incarnation = collections.Counter()
        self.max_in_flight = max_in_flight
        self.dsn = None  # --failover: both hosts, the writable one wins
        self.bank = False  # bank debits in the run: poll the rows left processing
        self.extra = []  # --consume-arg

    def args(self, i=0):
        p = self.prof
        d = lambda s: f"{int(s * 1000)}ms"
        return [self.cg, "--log-level", "debug", "consume", "--topic", TOPIC, "--channel", CHANNEL,
                "--nsqd-tcp-address", f"127.0.0.1:{self.nsqd.tcp}", "--migrate", "--key-namespace", NAMESPACE,
                "--stripe-api-base", f"https://127.0.0.1:{self.stripe.port}", "--stripe-ca-file",
                os.path.join(self.stripe.pki, "ca.pem"), "--max-in-flight", str(self.max_in_flight),
                "--msg-timeout", d(p["msg_timeout"]), "--heartbeat-interval", "1s", "--lease", d(p["lease"]),
                "--lease-renew-interval", d(p["renew"]), "--lease-held-delay", d(p["held"]),
                "--retry-same-key-delay", d(p["retry"]), "--indeterminate-delay", d(p["indeterminate"]),
                "--search-failed-delay", d(p["search"]), "--stripe-request-timeout", "20",
                "--correction-wait-delay", "1s",
                "--new-key-quiet", d(NEW_KEY_QUIET_S),
                *(["--processing-poll-after", d(POLL_AFTER_S)] if self.bank else []),
                "--health-listen", "127.0.0.1:0", "--shutdown-timeout", "10",
                # The sweep bound is derived from the flags above; the backfill runs often enough to be seen,
                # and searches both connected accounts even when a failover lost every row of one.
                "--backfill-interval", "5s", "--connect-accounts", ",".join(CONNECT_ACCOUNTS),
                *(["--pg-dsn", self.dsn] if self.dsn else []),
                # Consumer 1 runs its Stripe requests on the event loop (handshakes on the offload pool), the
                # others all on the offload pool: both placements under the same chaos.
                "--stripe-io", "loop" if i == 1 else "offload", *self.extra]

    def start(self, i):
        self.incarnation[i] += 1
        path = os.path.join(self.work, f"consume-{i}-{self.incarnation[i]}.log")
        self.logs[i] = path
        # The failpoint widens the windows between a delivery's steps to tens of milliseconds, so kills land in
        # each of them (the Stripe call is already that wide); see charge_flow_config::test_step_pause.
        env = dict(self.pg.env, STRIPE_API_KEY="sk_test_chaos", CHARGEGUARD_TEST_STEP_PAUSE_MS="60")
        with open(path, "wb") as f:
            self.procs[i] = subprocess.Popen(self.args(i), stdout=subprocess.DEVNULL, stderr=f, env=env)

    def kill(self, i):
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()
        return self.logs[i]

    def stop_all(self):
        for p in self.procs:
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        rcs = []
        for p in self.procs:
            if p:
                try:
                    rcs.append(p.wait(timeout=20))
                except subprocess.TimeoutExpired:
                    p.kill()
                    rcs.append("timeout")
        return rcs

    def crashed(self):
        """Consumers that exited on their own (a crash of the product, not one of ours)."""
        return [(i, p.returncode) for i, p in enumerate(self.procs) if p and p.poll() is not None]


def read_log(path):
    out = []
    try:
        with open(path, "rb") as f:
            for raw in f:
                try:
                    out.append(json.loads(raw))
                except ValueError:
                    pass  # a line cut by SIGKILL
    except FileNotFoundError:
        pass
    return out


STEP_OF = {"billing delivery received": 0, "ledger row written": 1, "recovering a pending billing record": 1,
           "calling Stripe": 2, "Stripe answered": 3}
DONE = ("billing message finished", "billing message requeued")


def in_flight_steps(lines):
    """message id → (furthest step reached, billing key) for deliveries the log shows started, not ended."""
    state = {}
    for ln in lines:
        mid, msg = ln.get("message_id"), ln.get("msg")
        if not mid:
            continue
        if msg in DONE:
            state.pop(mid, None)
        elif msg in STEP_OF:
            step, key = state.get(mid, (-1, None))
            state[mid] = (max(step, STEP_OF[msg]), ln.get("billing_key") or key)
    return state


def finished_ids(lines):
    return {ln["message_id"]: ln.get("reason") for ln in lines if ln.get("msg") == "billing message finished"}


def classify_kill(lines, pg, stripe):
    """Windows the kill landed in, one per delivery the killed worker had in progress, judged from its log
    and confirmed against the ledger and Stripe right after the kill."""
    hits = collections.Counter()
    for mid, (step, key) in in_flight_steps(lines).items():
        if step <= 0 or not key:
            hits["before_ledger_write"] += 1
            continue
        rows = pg.query(f"SELECT status FROM billing_records WHERE key = '{key}'")
        status = rows[0][0] if rows else None
        if step == 1:
            # Row written (or lease taken), Stripe not asked: nothing at Stripe from this worker yet.
            hits["between_write_and_call"] += 1
        elif step == 2:
            hits["during_call"] += 1
        elif status == "pending":
            hits["between_answer_and_update"] += 1
        else:
            hits["between_update_and_fin"] += 1
    return hits


# bank: None for a card payment; "ok" or "fail" for a bank debit that settles later.
Event = collections.namedtuple("Event", "cust scus amount expect pi off_session body bank acct",
                               defaults=(None, None))

# Stripe's US bank account test payment methods: the intent answers processing, then settles later.
BANK_OK, BANK_FAIL = "pm_usBankAccount_success", "pm_usBankAccount_insufficientFunds"


def connect_twins(valid, connect_share):
    """Moves `connect_share` of the valid events (picked by a hash of the customer id, so the seed's own draws
    are untouched) to the first connected account and adds, for each, the same customer id on the second (a
    different amount). Returns the twins' events; the moved events are replaced in `valid`."""
    twins = []
    for n, ev in enumerate(valid):
        if zlib.crc32(ev.cust.encode()) % 1000 >= connect_share * 1000:
            continue
        body = json.loads(ev.body)
        body["stripe_account"] = CONNECT_ACCOUNTS[0]
        valid[n] = ev._replace(body=json.dumps(body), acct=CONNECT_ACCOUNTS[0])
        body["stripe_account"] = CONNECT_ACCOUNTS[1]
        body["amount_cents"] = ev.amount + 1
        twins.append(ev._replace(body=json.dumps(body), acct=CONNECT_ACCOUNTS[1], amount=ev.amount + 1))
    return twins


def make_run(rng, n_events, pi_share=0.3, async_share=0.0, connect_share=0.0, correction_share=0.0,
             corrections=None):
    """Valid events (5 % for declined customers, 20 % with a second or third copy; `pi_share` of them with a
    payment_method, a fifth of those for customers whose card needs authentication; `async_share` of them a
    bank debit that answers processing and settles later, a third of those failing after processing) and 3 %
    invalid lines. Returns the events, the card-declined and authentication-required Stripe customers, the
    invalid lines and every body to publish."""
    valid, declined_customers, auth_customers, bodies = [], [], [], []
    for i in range(n_events):
        cust = f"cust-{i:05d}"
        # No draw when async_share is 0, so the seeds of runs without bank debits replay as before.
        bank = None
        if async_share > 0 and rng.random() < async_share:
            bank = "fail" if rng.random() < 1 / 3 else "ok"
        pi = bank is not None or rng.random() < pi_share
        auth = bank is None and pi and rng.random() < 0.2
        decl = bank is None and not auth and rng.random() < 0.05
        scus = f"cus_auth{i:05d}" if auth else f"cus_decl{i:05d}" if decl else f"cus_ok{i:05d}"
        if decl:
            declined_customers.append(scus)
        if auth:
            auth_customers.append(scus)
        ev = {"customer_id": cust, "billing_period": PERIOD, "amount_cents": 100 + rng.randrange(100000),
              "currency": "usd", "stripe_customer_id": scus, "description": "chaos"}
        off_session = None
        if bank:
            ev["payment_method"] = BANK_OK if bank == "ok" else BANK_FAIL
            off_session = True
        elif pi:
            ev["payment_method"] = f"pm_chaos{i:05d}"
            off_session = rng.choice([None, True, False])  # None: left to the default (true)
            if off_session is not None:
                ev["off_session"] = off_session
        body = json.dumps(ev)
        expect = "declined" if decl or auth else "failed_after_processing" if bank == "fail" else "charged"
        evs = [Event(cust, scus, ev["amount_cents"], expect, pi, off_session is not False if pi else None, body,
                     bank)]
        if connect_share > 0:
            evs += connect_twins(evs, connect_share)
        valid += evs
        copies = 1 + (rng.random() < 0.2) + (rng.random() < 0.1)
        for one in evs:
            bodies += [one.body] * copies
        # Corrections (docs/design.md §4a) of card charges: revision 1 raises the total (a charge of the
        # difference), revision 2 sets a new one anywhere from 0 to it (refunds, often over both payments).
        # Published like the rest, in any order (revision 2 waits for 1, 1 for the charge). No draw when the
        # share is 0, so the seeds of runs without corrections replay as before. A Connect customer's events
        # (the same customer id on both accounts) are each drawn on their own: one account's period may be
        # corrected while the other's, with the same customer id and period, must stay untouched.
        for one in evs:
            if correction_share > 0 and expect == "charged" and not pi and rng.random() < correction_share:
                t1 = one.amount + 1 + rng.randrange(5000)
                t2 = rng.randrange(0, t1 + 1)
                corrections[(cust, one.acct or "")] = (one.amount, t1, t2)
                for rev, total in ((1, t1), (2, t2)):
                    cev = dict(json.loads(one.body), amount_cents=total, revision=rev)
                    bodies += [json.dumps(cev)] * (1 + (rng.random() < 0.3))
    invalid = []
    for i in range(max(1, n_events * 3 // 100)):
        invalid.append(rng.choice([
            '{"customer_id":"bad-%d","billing_period":"%s","amount_cents":19.99,"currency":"usd",'
            '"stripe_customer_id":"cus_x"}' % (i, PERIOD),
            '{"customer_id":"bad-%d","billing_period":"%s","amount_cents":"1999","currency":"usd",'
            '"stripe_customer_id":"cus_x"}' % (i, PERIOD),
            '{"customer_id":"bad-%d","billing_period":"%s","amount_cents":1999,"currency":"usd",'
            '"stripe_customer_id":"cus_x","off_session":false}' % (i, PERIOD),
            'not json at all %d' % i,
            '{"customer_id":"bad-%d","billing_period":"%s","amount_cents":1999,"currency":"usd",'
            '"stripe_customer_id":"cus_x","stripe_account":"acct_"}' % (i, PERIOD),
            '{"customer_id":"bad-%d"}' % i]))
    bodies += invalid
    rng.shuffle(bodies)
    return valid, declined_customers, auth_customers, invalid, bodies


# A new key generation waits until no call under the old one has shown life for this long: more than the
# 20 s request timeout (timeouts are not retried), so no call a killed or cut-off worker left at fake-stripe
# (the stall holds one for msg_timeout + 3 s) can still charge when a search has found nothing.
NEW_KEY_QUIET_S = 25.0


def quiescence_bound(prof, pg_backoff_cap=60.0):
    """The longest a settled system may take once the chaos stops: a message held by a killed worker comes
    back after msg_timeout; it may find a lease (≤ lease, plus 10 % jitter and the floor) twice (the killed
    worker's, then a recovering worker's); an indeterminate answer waits its delay, then a search, and a
    failed search its own; a PostgreSQL error backs off up to 60 s by attempt; plus the stall and slack."""
    p = prof
    return (p["msg_timeout"] + 2 * (p["lease"] * 1.1 + p["held"] * 2) + p["indeterminate"] + p["search"] +
            p["retry"] + pg_backoff_cap + (p["msg_timeout"] + 3) + NEW_KEY_QUIET_S + 30)


def sweep_bound(prof):
    """The consumers' derived sweep bound (billing/heal/sweeper.hpp): 2 × msg_timeout + the longest requeue delay
    (the PostgreSQL backoff's 60 s max, or new-key-quiet + 0.1 s) + max(lease-held delay, lease / 10), plus
    one sweep interval (a quarter of it, 1–60 s) and one backfill interval."""
    p = prof
    b = 2 * p["msg_timeout"] + max(p["held"], p["retry"], p["indeterminate"], p["search"], 60.0,
                                   NEW_KEY_QUIET_S + 0.1) + max(p["held"], p["lease"] / 10)
    return b + min(max(b / 4, 1.0), 60.0) + 5


def run_seed(args, seed, profile_name):
    prof = PROFILES[profile_name]
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix=f"cg-chaos-{seed}-")
    os.chmod(work, 0o755)
    procs = []
    report = dict(seed=seed, profile=profile_name, events=args.events, ok=False, failures=[],
                  kills=collections.Counter(), kill_count=0, broker="real nsqd" if args.nsqd_bin else "fake-nsqd")
    t_start = time.monotonic()
    pg = nsqd = stripe = cons = standby = hooks = None
    try:
        # (customer, account or "") → (original, revision 1's total, revision 2's total)
        corrections = {}
        valid, declined, auth, invalid, bodies = make_run(rng, args.events, args.pi_share, args.async_share,
                                                          args.connect_share, args.correction_share, corrections)
        bank = args.async_share > 0
        pg = Postgres(work)
        nsqd = Nsqd(work, args.build, args.nsqd_bin)
        hooks = Webhooks(work, args.build, pg) if bank else None
        stripe = Stripe(work, args.build, declined, auth, hooks.url() if hooks else None,
                        (args.webhook_duplicate_pct, args.webhook_reorder_pct))
        for account in CONNECT_ACCOUNTS:
            customers = sorted({ev.scus for ev in valid if ev.acct == account})
            if customers:
                stripe.connect(account, customers)
        report["connect_events"] = sum(1 for ev in valid if ev.acct)
        # Realistic latency so kills land during calls too.
        stripe.faults(latency_ms=40, latency_jitter_ms=160)
        cons = Consumers(work, args.build, nsqd, pg, stripe, prof, args.consumers, args.max_in_flight)
        cons.extra = list(args.consume_arg)
        cons.bank = bank
        standby = None
        if args.failover != "none":
            standby = Standby(work, pg, args.failover == "sync")
            cons.dsn = (f"host=127.0.0.1,127.0.0.1 port={pg.port},{standby.port} dbname=chargeguard_test "
                        "user=postgres target_session_attrs=read-write connect_timeout=2")
            report["failover"] = args.failover
            if hooks:
                hooks.dsn = cons.dsn
                hooks.kill()
                hooks.start()
        for i in range(args.consumers):
            cons.start(i)

        # The schedule, all from the seed: publish times over the first 70 % of the chaos, kill times, the
        # PostgreSQL and nsqd restarts, and the Stripe fault bursts.
        dur = args.duration
        # Bursts, so many deliveries are in flight at once (and queue for pooled connections): kills then land
        # in every step of a delivery, not only in the Stripe call.
        bursts = sorted(rng.uniform(0, dur * 0.7) for _ in range(args.bursts))
        batches = collections.defaultdict(list)
        for body in bodies:
            batches[rng.randrange(args.bursts)].append(body)
        publishes = [(bursts[i], batches[i]) for i in range(args.bursts) if batches[i]]
        kills, t = [], rng.uniform(0.5, 3)
        while t < dur:
            kills.append((t, rng.randrange(args.consumers), rng.uniform(0, 0.5)))
            t += rng.uniform(0.5, 3)
        # And kills right behind the bursts, when deliveries are at every step (received and waiting for a
        # connection, row written, at Stripe, answered, settled).
        for b in bursts:
            for _ in range(2):
                kills.append((b + rng.uniform(0.02, 1.2), rng.randrange(args.consumers), rng.uniform(0, 0.5)))
        kills.sort()
        pg_restart_at = rng.uniform(dur * 0.2, dur * 0.5)
        nsqd_restart_at = rng.uniform(dur * 0.5, dur * 0.8) if nsqd.real else None
        stall_at = rng.uniform(dur * 0.1, dur * 0.6)
        # The webhook receiver is SIGKILLed twice and stays down a moment: Stripe's retries carry the events.
        hook_kills = sorted((rng.uniform(dur * 0.1, dur * 0.9), rng.uniform(0.5, 2.5)) for _ in range(2)) \
            if hooks else []
        hook_restart_at = None
        report["nsqd_restart"] = "yes" if nsqd.real else "skipped (fake-nsqd keeps messages in memory)"

        t0 = time.monotonic()
        next_fault, armings = 0.0, 0
        restarts = []  # (time, consumer)
        killed_logs = []
        events = ["pg", "nsqd", "stall"]
        held_at = None  # --failover: when the standby was held behind
        # --failover: the rows the promoted standby shows pending though Stripe had charged them at the
        # failover (settles it lost, and deliveries between their answer and their settle), and when each was
        # seen settled: the heal time after a failover.
        fo = dict(at=None, keys=[], next_check=0.0)

        def failover_settled():
            if fo["at"] is None or "failover_heal_s" in report or time.monotonic() < fo["next_check"]:
                return
            fo["next_check"] = time.monotonic() + 0.5
            keys = ",".join(f"'{k}'" for k in fo["keys"]) or "''"
            try:
                left = pg.query(f"SELECT count(*) FROM billing_records WHERE status = 'pending' AND key IN ({keys})",
                                retries=3)[0][0]
            except RuntimeError:
                return  # the next look tells
            if left == "0":
                report["failover_heal_s"] = round(time.monotonic() - fo["at"], 1)
        while True:
            now = time.monotonic() - t0
            if now >= dur and not publishes:
                break
            while publishes and publishes[0][0] <= now:
                nsqd.publish(publishes.pop(0)[1])
            while kills and kills[0][0] <= now:
                _, i, delay = kills.pop(0)
                if cons.procs[i].poll() is None:
                    path = cons.kill(i)
                    killed_logs.append(path)
                    report["kill_count"] += 1
                    report["kills"].update(classify_kill(read_log(path), pg, stripe))
                    restarts.append((now + delay, i))
            for r in [r for r in restarts if r[0] <= now]:
                restarts.remove(r)
                cons.start(r[1])
            if hook_kills and hook_kills[0][0] <= now and hook_restart_at is None:
                _, down = hook_kills.pop(0)
                hooks.kill()
                report["webhook_kills"] = report.get("webhook_kills", 0) + 1
                hook_restart_at = now + down
            if hook_restart_at is not None and now >= hook_restart_at:
                hooks.start()
                hook_restart_at = None
            if "pg" in events and now >= pg_restart_at and standby:
                events.remove("pg")
                log(f"   [{now:5.1f}s] standby held behind (walreceiver disconnected)")
                standby.hold()
                events.append("promote")
                held_at = time.monotonic() - t0
            if "promote" in events and now >= held_at + 2.0:
                events.remove("promote")
                lost_wal = standby.fail_over()
                report["wal_lost_bytes"] = lost_wal
                fo["at"] = time.monotonic()
                paid = {(c.get("metadata") or {}).get("billing_key") for c in stripe.charges()
                        if c.get("status") == "succeeded"}
                fo["keys"] = [r[0] for r in pg.query("SELECT key FROM billing_records WHERE status = 'pending'")
                              if r[0] in paid]
                report["failover_pending_paid"] = len(fo["keys"])
                log(f"   [{now:5.1f}s] primary SIGKILLed, standby promoted ({lost_wal} bytes of WAL not received)")
            if "pg" in events and now >= pg_restart_at:
                events.remove("pg")
                log(f"   [{now:5.1f}s] PostgreSQL restart")
                pg.restart()
            if "nsqd" in events and nsqd_restart_at is not None and now >= nsqd_restart_at:
                events.remove("nsqd")
                log(f"   [{now:5.1f}s] nsqd restart (SIGTERM, same data path)")
                nsqd.restart()
            if "stall" in events and now >= stall_at:
                events.remove("stall")
                stripe.faults(stall_ms=int((prof["msg_timeout"] + 3) * 1000), stall_count=2)
            if now >= next_fault and now < dur:
                # About 5 % 500-after-create, 5 % dropped-after-create, 5 % 429 of the ~10–20 POSTs a second.
                # Every other second they wait for a PaymentIntent: left to chance (a third of the POSTs), that
                # endpoint went a whole 3-seed run without a 500-after-create once.
                to_intents = args.pi_share > 0 and armings % 2 == 1
                stripe.faults(fail_after_create=int(rng.random() < 0.6), drop_after_create=int(rng.random() < 0.6),
                              rate_limit=int(rng.random() < 0.6),
                              fault_path="/v1/payment_intents" if to_intents else "")
                armings += 1
                next_fault = now + 1.0
            failover_settled()
            for i, rc in cons.crashed():
                if i not in [r[1] for r in restarts]:
                    report["failures"].append(f"consumer {i} exited by itself with status {rc} "
                                              f"(log {cons.logs[i]})")
                    cons.start(i)
            time.sleep(0.02)
        for _, i in restarts:
            cons.start(i)
        if hook_restart_at is not None:
            hooks.start()
        stripe.faults(fail_after_create=0, drop_after_create=0, rate_limit=0, stall_count=0, fault_path="")

        # Quiescence: the channel drained and nothing pending in the ledger.
        bound = quiescence_bound(prof)
        if bank:
            # A bank debit settles SETTLE_AFTER_MS after its answer; its webhook may need every retry (the
            # backoff sums to under 12 s), or, lost, the poll after POLL_AFTER_S.
            bound += SETTLE_AFTER_MS / 1000 + POLL_AFTER_S + 12
        if standby:
            bound += sweep_bound(prof)  # rows whose settle the failover lost wait out the sweep bound
        lost = []
        if args.lose_commits:
            # What a failover with asynchronous replication leaves once the channel has drained: the last
            # commits gone — some settles (the row back to pending, its message FINed) and some pre-flight
            # inserts (no row at all) — though Stripe charged. Only the sweeper and the backfill can heal them.
            # The harness edits the rows directly (the WAL tail of a real failover is not reproducible here);
            # the sweep bound counts from this moment.
            wait_until(lambda: (nsqd.channel_stats() or {}).get("depth", 1) == 0 and
                       pg.query("SELECT count(*) FROM billing_records WHERE status = 'pending'")[0][0] == "0",
                       bound, step=0.25)
            rows = [r[0] for r in pg.query("SELECT key FROM billing_records WHERE status = 'charged' ORDER BY key")]
            lost = rng.sample(rows, min(args.lose_commits, len(rows)))
            half = len(lost) // 2
            keys = lambda ks: ",".join(f"'{k}'" for k in ks) or "''"
            pg.query("UPDATE billing_records SET status = 'pending', charge_id = NULL, payment_intent_id = NULL, "
                     f"lease_until = now() WHERE key IN ({keys(lost[:half])})")
            pg.query(f"DELETE FROM billing_records WHERE key IN ({keys(lost[half:])})")
            log(f"   lost commits: {half} settles reverted to pending, {len(lost) - half} rows deleted")
            if args.lose_account:
                # Every row of the second connected account lost: the ledger no longer names the account,
                # so only the backfill's --connect-accounts search can bring its charged rows back.
                gone = pg.query("WITH d AS (DELETE FROM billing_records WHERE stripe_account = "
                                f"'{CONNECT_ACCOUNTS[1]}' RETURNING key, status) SELECT key, status FROM d")
                lost += [k for k, st in gone if st == "charged" and k not in lost]
                report["account_rows_lost"] = [k for k, _ in gone]
                # Their dead letters (bank debits failed after processing) went with them: the backfill
                # writes the letter again when it restores such a row.
                pg.query(f"DELETE FROM dead_letters WHERE billing_key IN ({keys([k for k, _ in gone])})")
                log(f"   lost account {CONNECT_ACCOUNTS[1]}: all its {len(gone)} rows deleted")
            bound += sweep_bound(prof) + 30
        t_chaos_end = time.monotonic()

        def quiet():
            st = nsqd.channel_stats()
            if not st or st["topic_depth"] or st["depth"] or st["in_flight"] or st["deferred"]:
                return False
            return pg.query("SELECT count(*) FROM billing_records WHERE status IN ('pending', 'processing')")[0][0] \
                == "0"

        def restored():
            # After an asynchronous failover, a row lost entirely (its delivery already finished) comes back
            # only through the backfill, which runs every few seconds: the ledger is not settled until every
            # key Stripe charged (or holds a bank debit for) has its row again.
            if report.get("failover") != "async":
                return True
            want = {(c.get("metadata") or {}).get("billing_key") for c in stripe.charges()
                    if c.get("status") == "succeeded" or
                    (c.get("payment_method_details") or {}).get("type") == "us_bank_account"}
            have = {r[0] for r in pg.query("SELECT key FROM billing_records")}
            # A correction's payments carry their move's key (base-r<N>…), which names no billing_records row.
            return not {k for k in want if k and len(k) == 32} - have

        def healed():
            if not lost:
                return True
            n = pg.query("SELECT count(*) FROM billing_records WHERE status = 'charged' AND key IN (" +
                         ",".join(f"'{k}'" for k in lost) + ")")[0][0]
            return int(n) == len(lost)

        reached = wait_until(lambda: (failover_settled(), quiet() and healed() and restored())[1], bound, step=0.25)
        failover_settled()
        report["quiescence_s"] = round(time.monotonic() - t_chaos_end, 1)
        if lost:
            report["lost_commits"] = len(lost)
            report["heal_s"] = report["quiescence_s"]
        report["quiescence_bound_s"] = round(bound, 1)
        if not reached:
            st = nsqd.channel_stats()
            pend = pg.query("SELECT key, status, stripe_attempts, lease_until, indeterminate_since, last_error "
                            "FROM billing_records WHERE status IN ('pending', 'processing') LIMIT 5")
            report["failures"].append(f"no quiescence within {bound:.0f} s: nsqd {st}, pending rows {pend}")

        rcs = cons.stop_all()
        if any(rc != 0 for rc in rcs):
            report["failures"].append(f"consumers did not drain cleanly on SIGTERM: exit statuses {rcs}")
        report["fault_hits"] = stripe.fault_hits()
        if hooks:
            stripe.webhooks_idle(15)
            hooks.stop()
        check(report, valid, invalid, pg, stripe, declined_and_finished(work), corrections)
        report["backfilled"] = sum(1 for name in os.listdir(work) if name.startswith("consume-")
                                   for ln in read_log(os.path.join(work, name))
                                   if ln.get("component") == "backfill" and ln.get("alert"))
        if hooks:
            check_webhooks(report, pg, stripe)
        # Deliveries a worker settled but whose FIN never reached nsqd come back as prevented duplicates of
        # the same message: the "between the update and FIN" window, seen from the redelivery.
        report["kills"]["between_update_and_fin"] += settled_then_redelivered(work, killed_logs)
        report["ok"] = not report["failures"]
    except Exception as e:  # setup or harness failure: reported as a failure of this seed
        report["failures"].append(f"harness: {type(e).__name__}: {e}")
    finally:
        for x in (cons,):
            if x:
                for p in x.procs:
                    if p and p.poll() is None:
                        p.kill()
        for x in (hooks, stripe, nsqd, pg):
            if x:
                try:
                    x.stop()
                except Exception:
                    pass
        if standby:  # whichever of the two is not pg's any more
            for d in (standby.dir, os.path.join(work, "pg")):
                subprocess.run([os.path.join(ROOT, "ci", "pg-cluster"), "stop", d], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        report["seconds"] = round(time.monotonic() - t_start, 1)
        report["work"] = work
        if report["ok"] and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return report


def settled_then_redelivered(work, killed_logs):
    """Deliveries a killed worker settled (and logged as finished) whose FIN never reached nsqd: the same
    message came back and was finished as a prevented duplicate by another incarnation."""
    settled = set()
    for path in killed_logs:
        for ln in read_log(path):
            if ln.get("msg") == "billing message finished" and \
                    ln.get("reason") in ("charged", "declined", "needs_authentication"):
                settled.add(ln.get("message_id"))
    n = 0
    for name in sorted(os.listdir(work)):
        path = os.path.join(work, name)
        if not name.startswith("consume-") or path in killed_logs:
            continue
        for ln in read_log(path):
            mid = ln.get("message_id")
            if ln.get("msg") == "billing message finished" and ln.get("reason") == "duplicate_prevented" and \
                    mid in settled:
                settled.discard(mid)
                n += 1
    return n


def declined_and_finished(work):
    """Customers whose delivery some consumer finished as declined (logged after the row's settle
    committed, just before the FIN; a decline that asks for authentication is one too): a decline the ledger
    once held."""
    out = set()
    for name in sorted(os.listdir(work)):
        if name.startswith("consume-"):
            for ln in read_log(os.path.join(work, name)):
                if ln.get("msg") == "billing message finished" and \
                        ln.get("reason") in ("declined", "needs_authentication"):
                    out.add(ln.get("customer_id"))
    return out


def same_event(body, ev):
    try:
        got, want = json.loads(body), json.loads(ev.body)
    except ValueError:
        return False
    return all(got.get(k) == want.get(k) for k in ("customer_id", "billing_period", "amount_cents",
                                                   "stripe_customer_id", "payment_method", "stripe_account"))


def check(report, valid, invalid, pg, stripe, declined_finished=frozenset(), corrections=None):
    f = report["failures"]
    charges = stripe.charges()
    intents = stripe.intents()
    by_key = collections.defaultdict(list)  # succeeded charges
    any_by_key = collections.defaultdict(list)  # every charge, failed ones included
    charge_by_id = {}
    for c in charges:
        md = c.get("metadata") or {}
        charge_by_id[c["id"]] = c
        any_by_key[md.get("billing_key")].append(c["id"])
        if c.get("status") == "succeeded":
            by_key[md.get("billing_key")].append(c["id"])
    intents_by_key = collections.defaultdict(list)
    for p in intents:
        intents_by_key[(p.get("metadata") or {}).get("billing_key")].append(p)
    rows = {r[0]: (r[1], r[2], r[3]) for r in pg.query(
        "SELECT key, status, coalesce(charge_id, ''), coalesce(payment_intent_id, '') FROM billing_records")}
    row_accounts = {r[0]: r[1] for r in pg.query("SELECT key, coalesce(stripe_account, '') FROM billing_records")}
    letters = pg.query("SELECT coalesce(billing_key, ''), convert_from(raw_body, 'UTF8'), reason FROM dead_letters")
    letter_bodies = collections.Counter(b for _, b, _ in letters)
    letters_by_key = collections.defaultdict(list)
    for k, b, _ in letters:
        letters_by_key[k].append(b)
    valid_keys = set()
    duplicates = uncharged = pi_charged = pi_declined = bank_charged = bank_failed = 0
    for ev in valid:
        cust = ev.cust if not ev.acct else f"{ev.cust}@{ev.acct}"
        key = billing_key(ev.cust, ev.acct)
        valid_keys.add(key)
        got = by_key.get(key, [])
        status, charge_id, intent_id = rows.get(key, (None, None, None))
        its = intents_by_key.get(key, [])
        # An asynchronous failover can lose a row whose delivery was already finished: its insert and every
        # later commit were in the WAL the standby never received, and the message will not come back.
        row_lost = status is None and (report.get("failover") == "async" or
                                       key in report.get("account_rows_lost", ()))
        # Per account: every payment carrying the key lives in the event's account, and so does its row.
        want_account = ev.acct or ""
        elsewhere = [c for c in any_by_key.get(key, []) if charge_by_id[c].get("account", "") != want_account]
        elsewhere += [p["id"] for p in its if p.get("account", "") != want_account]
        if elsewhere:
            f.append(f"{cust}: payments outside account {want_account or 'platform'}: {elsewhere}")
        if key in row_accounts and row_accounts[key] != want_account:
            f.append(f"{cust}: ledger row in account {row_accounts[key]!r}, want {want_account!r}")
        if ev.pi:
            # One intent per key: a second would be a second attempt at the customer's card (never twice);
            # none would mean the event never reached Stripe (never zero times).
            if len(its) != 1:
                f.append(f"{cust}: {len(its)} payment intents for one key: {[p['id'] for p in its]}")
                if len(its) > 1:
                    duplicates += 1
            it = its[0] if its else None
            if it and intent_id != it["id"] and not (row_lost and ev.expect == "declined"):
                f.append(f"{cust}: ledger payment_intent_id {intent_id!r}, Stripe intent {it['id']}")
        elif its:
            f.append(f"{cust}: /v1/charges event has payment intents {[p['id'] for p in its]}")
        if ev.expect == "declined" and row_lost and ev.cust in declined_finished:
            # The decline was settled and finished before the failover lost its row. The backfill restores
            # rows whose money moved (or may still move) only; a lost decline is left to a redelivery or
            # reconcile (docs/operating/ha-postgres.md). Counted, not hidden; nothing may have been charged.
            if got:
                f.append(f"declined customer {cust} has succeeded charges {got}")
            if len(any_by_key.get(key, [])) > 1:
                f.append(f"declined customer {cust}: retried into {len(any_by_key[key])} charges {any_by_key[key]}")
            report["declined_rows_lost"] = report.get("declined_rows_lost", 0) + 1
        elif ev.expect == "declined":
            if got:
                f.append(f"declined customer {cust} has succeeded charges {got}")
            if status != "declined":
                f.append(f"declined customer {cust}: ledger status {status}, want declined")
            if len(any_by_key.get(key, [])) > 1:
                f.append(f"declined customer {cust}: retried into {len(any_by_key[key])} charges {any_by_key[key]}")
            if ev.pi and its:
                it = its[0]
                want = "requires_action" if ev.scus.startswith("cus_auth") and not ev.off_session \
                    else "requires_payment_method"
                if it["status"] != want:
                    f.append(f"{cust}: declined intent {it['id']} is {it['status']}, want {want}")
                if want == "requires_action" and any_by_key.get(key):
                    f.append(f"{cust}: intent needing authentication has charges {any_by_key[key]}")
                pi_declined += 1
        elif ev.expect == "failed_after_processing":
            # The bank said no after processing: nothing charged, the row failed after processing with a
            # dead letter (whose replay would charge again), the intent back to requires_payment_method.
            if got:
                f.append(f"{cust}: failed bank debit has succeeded charges {got}")
            if status != "failed_after_processing":
                f.append(f"{cust}: failed bank debit: ledger {status}, want failed_after_processing")
            # One letter for the key, carrying this event: the published bytes, or — when the sweeper re-drove
            # a row whose commits a failover lost, or the backfill restored a row the failover lost entirely —
            # the event as it was rebuilt from the row or the charge.
            mine = letters_by_key.get(key, [])
            if len(mine) != 1 or not same_event(mine[0], ev):
                f.append(f"{cust}: failed bank debit has {len(mine)} dead letters for its key, want 1 carrying "
                         f"its event: {[b[:80] for b in mine]}")
            if its and (its[0]["status"] != "requires_payment_method" or
                        (its[0].get("last_payment_error") or {}).get("code") != "insufficient_funds"):
                f.append(f"{cust}: failed bank debit intent {its[0]['id']} is {its[0]['status']}")
            bank_failed += 1
        else:
            if len(got) > 1:
                duplicates += 1
                f.append(f"{cust}: charged {len(got)} times: {got}")
            if not got:
                uncharged += 1
                f.append(f"{cust}: never charged (ledger {status})")
            if status != "charged" or (got and charge_id != got[0]):
                f.append(f"{cust}: ledger {status} {charge_id}, Stripe {got}")
            if ev.pi and its:
                it = its[0]
                if it["status"] != "succeeded" or (got and it.get("latest_charge") != got[0]):
                    f.append(f"{cust}: intent {it['id']} {it['status']} latest_charge {it.get('latest_charge')}, "
                             f"succeeded charges {got}")
                elif charge_by_id[got[0]].get("payment_intent") != it["id"]:
                    f.append(f"{cust}: charge {got[0]} points at intent "
                             f"{charge_by_id[got[0]].get('payment_intent')}, not {it['id']}")
                else:
                    pi_charged += 1
                    bank_charged += ev.bank == "ok"
            elif not ev.pi and got and charge_by_id[got[0]].get("payment_intent"):
                f.append(f"{cust}: /v1/charges event charged through an intent")
        if letter_bodies.get(ev.body) and ev.expect != "failed_after_processing":
            f.append(f"valid event for {cust} was dead-lettered")
    # An asynchronous failover loses the last commits, a dead letter's too: its message was FINed after the
    # insert committed on the old primary, and no Stripe object carries it for the backfill to find. Such
    # losses are counted and printed (docs/operating/ha-postgres.md says so); with synchronous replication,
    # or without a failover, every invalid line must be in dead_letters.
    lost_letters = []
    for body in invalid:
        if not letter_bodies.get(body):
            if report.get("failover") == "async":
                lost_letters.append(body)
            else:
                f.append(f"invalid line not dead-lettered: {body[:60]}")
    report["dead_letters_lost"] = len(lost_letters)
    if corrections:  # the partition run shares check() and has no corrections (nor a refund listing)
        check_corrections(report, corrections, by_key, charge_by_id, pg, stripe, valid)
    correction_keys = {billing_key(c, a) + "-r1" for c, a in (corrections or {})}
    stray = [k for k in by_key if k not in valid_keys and k not in correction_keys] + \
        [k for k in intents_by_key if k not in valid_keys]
    if stray:
        f.append(f"charges or intents for unknown keys: {stray[:5]}")
    report["charges"] = sum(len(v) for v in by_key.values())
    report["pi_events"] = sum(1 for ev in valid if ev.pi)
    report["pi_charged"] = pi_charged
    report["pi_declined"] = pi_declined
    report["intents"] = len(intents)
    report["duplicates"] = duplicates
    report["uncharged"] = uncharged
    report["dead_letters"] = len(letters)
    report["bank_events"] = sum(1 for ev in valid if ev.bank)
    report["bank_charged"] = bank_charged
    report["bank_failed"] = bank_failed
    report["connect_charged"] = sum(1 for ev in valid if ev.acct and ev.expect == "charged" and
                                    len(by_key.get(billing_key(ev.cust, ev.acct), [])) == 1)


def check_corrections(report, corrections, by_key, charge_by_id, pg, stripe, valid):
    """Each corrected period's money moved exactly once, per (customer, period, account): revision 1's
    difference charged once under base-r1 in the event's account, revision 2's refunds made once each (one
    refund per planned move, by its metadata key) in that account, and the money at Stripe for the entry —
    charges less refunds — equal to revision 2's total; both revisions applied. Every entry not corrected
    (the platform's or the other account's of a corrected customer id among them) keeps its charge whole:
    no refund, no correction charge, no correction row."""
    f = report["failures"]
    refunds = stripe.refunds()
    for account in CONNECT_ACCOUNTS:
        refunds += stripe.refunds(account)
    by_corrects = collections.defaultdict(list)
    for r in refunds:
        md = r.get("metadata") or {}
        if r.get("status") not in ("failed", "canceled"):
            by_corrects[md.get("corrects")].append(r)
    status = {(r[0], int(r[1])): r[2] for r in pg.query(
        "SELECT base_key, revision, status FROM billing_corrections")}
    moved_twice = 0
    for (cust, acct), (orig, t1, t2) in corrections.items():
        who = cust if not acct else f"{cust}@{acct}"
        key = billing_key(cust, acct)
        up = by_key.get(key + "-r1", [])
        if len(up) != 1 or charge_by_id[up[0]]["amount"] != t1 - orig:
            f.append(f"{who}: revision 1 charges {up}, want one of {t1 - orig}")
            moved_twice += len(up) > 1
        mine = by_corrects.get(key, [])
        outside = [c for c in up if charge_by_id[c].get("account", "") != acct] + \
            [r["id"] for r in mine if r["_account"] != acct]
        if outside:
            f.append(f"{who}: correction payments outside account {acct or 'platform'}: {outside}")
        per_move = collections.Counter((r.get("metadata") or {}).get("billing_key") for r in mine)
        if any(n > 1 for n in per_move.values()):
            moved_twice += 1
            f.append(f"{who}: a refund made twice: {dict(per_move)}")
        charged = sum(charge_by_id[c]["amount"] for c in by_key.get(key, []) + up)
        net = charged - sum(r["amount"] for r in mine)
        if net != t2:
            f.append(f"{who}: {net} at Stripe after corrections, want revision 2's total {t2}")
        for rev in (1, 2):
            if status.get((key, rev)) != "applied":
                f.append(f"{who}: revision {rev} is {status.get((key, rev))}, want applied")
    corrected = {billing_key(c, a) for c, a in corrections}
    untouched = 0
    for ev in valid:
        key = billing_key(ev.cust, ev.acct)
        if key in corrected or ev.expect != "charged":
            continue
        who = ev.cust if not ev.acct else f"{ev.cust}@{ev.acct}"
        moved = [r["id"] for r in by_corrects.get(key, [])] + by_key.get(key + "-r1", []) + \
            [f"row r{rev}" for (k, rev) in status if k == key]
        if moved:
            f.append(f"{who}: not corrected, yet money moved for it: {moved}")
        untouched += (ev.cust, "") in corrections or any((ev.cust, a) in corrections for a in CONNECT_ACCOUNTS)
    report["corrections"] = len(corrections)
    report["connect_corrections"] = sum(1 for _, a in corrections if a)
    report["corrected_twins_untouched"] = untouched
    report["correction_refunds"] = sum(len(v) for v in by_corrects.values())
    report["corrections_moved_twice"] = moved_twice


def check_webhooks(report, pg, stripe):
    """Every event fake-stripe saw acknowledged is recorded (the receiver answers 2xx only after the insert
    committed), and each once: duplicates and retries were acknowledged and ignored."""
    f = report["failures"]
    d = stripe.deliveries()
    st = d["stats"]
    acked = {x["event"] for x in d["data"] if 200 <= x["status"] < 300}
    rows = pg.query("SELECT id FROM stripe_webhook_events")
    recorded = [r[0] for r in rows]
    if len(recorded) != len(set(recorded)):
        f.append(f"webhook events recorded twice: {len(recorded) - len(set(recorded))}")
    missing = acked - set(recorded)
    # An asynchronous failover loses the last commits, the receiver's too (Stripe does not send an
    # acknowledged event again; the poll settles its row instead): counted, as the lost dead letters are.
    if missing and report.get("failover") == "async":
        report["webhook_events_lost"] = len(missing)
    elif missing:
        f.append(f"{len(missing)} acknowledged webhook events not recorded: {sorted(missing)[:3]}")
    if st["outstanding"]:
        f.append(f"{st['outstanding']} webhook deliveries still outstanding at fake-stripe")
    report["webhooks"] = dict(events=st["events"], attempts=st["attempts"], acked_events=st["acked_events"],
                              failed_attempts=st["failed"], duplicates=st["duplicates"], reordered=st["reordered"],
                              given_up=st["given_up"], recorded=len(recorded), receiver_kills=report.get("webhook_kills", 0))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="meson build directory with chargeguard and the doubles")
    ap.add_argument("--seed", type=int, action="append", help="run this seed (repeatable; replays a failure)")
    ap.add_argument("--seeds", type=int, default=3, help="run this many seeds from --first-seed")
    ap.add_argument("--first-seed", type=int, default=None, help="default: random, printed")
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--pi-share", type=float, default=0.3,
                    help="share of valid events charged through PaymentIntents (payment_method set)")
    ap.add_argument("--async-share", type=float, default=0.15,
                    help="share of valid events paid by bank debit (processing, settled later by webhook or poll; "
                         "a third fail after processing); 0: none, and no webhook receiver")
    ap.add_argument("--connect-share", type=float, default=0.1,
                    help="share of customers charged on behalf of two Stripe Connect accounts (the same customer id "
                         "on both; each a second event); 0: platform only")
    ap.add_argument("--webhook-duplicate-pct", type=int, default=20, help="events fake-stripe delivers twice")
    ap.add_argument("--webhook-reorder-pct", type=int, default=20,
                    help="events held back behind a later event about the same payment")
    ap.add_argument("--correction-share", type=float, default=0.0,
                    help="card-charged events followed by two corrections (a rise, then a new total)")
    ap.add_argument("--consumers", type=int, default=3)
    ap.add_argument("--max-in-flight", type=int, default=50)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of chaos per seed")
    ap.add_argument("--bursts", type=int, default=8, help="the run is published in this many MPUB bursts")
    ap.add_argument("--profile", choices=["short", "scaled", "both"], default="both",
                    help="timings; 'both' alternates by seed")
    ap.add_argument("--nsqd-bin", default=os.environ.get("NSQD_BIN", ""))
    ap.add_argument("--lose-account", action="store_true",
                    help="with --lose-commits: also delete every ledger row of the second Connect account")
    ap.add_argument("--lose-commits", type=int, default=0,
                    help="after the chaos, drop this many settled rows' last commits (half back to pending, half "
                         "deleted), as an asynchronous-replication failover would; the sweeper and the backfill "
                         "must heal them within the bound")
    ap.add_argument("--failover", choices=["none", "async", "sync"], default="none",
                    help="instead of the PostgreSQL restart: a streaming standby (pg_basebackup), the consumers "
                         "on a two-host DSN, the standby held behind for 2 s, the primary SIGKILLed and the "
                         "standby promoted; sync makes the primary wait for the standby")
    ap.add_argument("--consume-arg", action="append", default=[], help="extra argument for every consume")
    ap.add_argument("--keep", action="store_true", help="keep the work directories of passing seeds")
    ap.add_argument("--json", action="store_true", help="print the per-seed reports as JSON lines on stdout")
    args = ap.parse_args()
    if args.failover != "none" and not os.path.exists(os.path.join(PG_BIN, "pg_basebackup")):
        print(f"skipped: --failover needs {PG_BIN}/pg_basebackup")
        sys.exit(77)

    if not shutil.which("psql") or not os.path.exists("/usr/lib/postgresql/15/bin/initdb"):
        print("skipped: chaos test needs PostgreSQL 15 (initdb, psql)")
        return 77
    for exe in ("src/app/chargeguard", "tests/doubles/stripe/fake-stripe", "tests/doubles/nsq/fake-nsqd"):
        if not os.path.exists(os.path.join(args.build, exe)):
            print(f"skipped: {exe} is not built in {args.build}")
            return 77
    if args.nsqd_bin and not os.access(args.nsqd_bin, os.X_OK):
        args.nsqd_bin = ""
    if not args.nsqd_bin:
        log("note: NSQD_BIN not set: running on fake-nsqd, without the broker restart")

    if args.seed:
        seeds = args.seed
    else:
        first = args.first_seed if args.first_seed is not None else random.SystemRandom().randrange(1, 10**6)
        seeds = list(range(first, first + args.seeds))
    totals = dict(runs=0, events=0, kills=collections.Counter(), kill_count=0, charges=0, duplicates=0,
                  uncharged=0, worst_quiescence_s=0.0, failed=[], pi_events=0, pi_charged=0, pi_declined=0,
                  fault_hits=collections.Counter())
    for n, seed in enumerate(seeds):
        profile = args.profile if args.profile != "both" else ("short" if seed % 2 else "scaled")
        log(f"== chaos seed {seed} ({profile} timings, {args.events} events, {args.consumers} consumers, "
            f"{args.duration:.0f} s)")
        r = run_seed(args, seed, profile)
        kills = ", ".join(f"{w} {r['kills'].get(w, 0)}" for w in WINDOWS)
        log(f"   {'ok' if r['ok'] else 'FAILED'} in {r['seconds']} s: {r.get('charges', '?')} charges, "
            f"{r.get('duplicates', '?')} duplicates, {r.get('uncharged', '?')} uncharged, "
            f"{r.get('dead_letters', '?')} dead letters; quiescence {r.get('quiescence_s', '?')} s "
            f"(bound {r.get('quiescence_bound_s', '?')} s); nsqd restart {r.get('nsqd_restart', '?')}; "
            f"{r['kill_count']} kills caught deliveries at: {kills}")
        if r.get("failover"):
            log(f"   failover ({r['failover']}): {r.get('failover_pending_paid', '?')} rows pending though paid at the "
                f"failover, all settled {r.get('failover_heal_s', '?')} s after it")
            log(f"   failover ({r['failover']}): {r.get('wal_lost_bytes', '?')} bytes of WAL lost; ledger agreed "
                f"with Stripe {r.get('quiescence_s', '?')} s after the chaos; {r.get('backfilled', 0)} rows "
                "restored by the backfill; "
                f"{r.get('dead_letters_lost', 0)} dead letters of invalid lines lost with the commits; "
                f"{r.get('declined_rows_lost', 0)} rows of declines and "
                f"{r.get('webhook_events_lost', 0)} "
                "acknowledged webhook events lost with them")
        if r.get("lost_commits"):
            log(f"   lost commits: {r['lost_commits']} rows healed by the sweeper and the backfill in "
                f"{r.get('heal_s', '?')} s")
        log(f"   PaymentIntents: {r.get('pi_events', '?')} events, {r.get('intents', '?')} intents, "
            f"{r.get('pi_charged', '?')} charged, {r.get('pi_declined', '?')} declined; fault hits: "
            + ", ".join(f"{k} {v}" for k, v in sorted((r.get("fault_hits") or {}).items())))
        if r.get("connect_events"):
            log(f"   Stripe Connect: {r['connect_events']} events on {len(CONNECT_ACCOUNTS)} accounts (the same "
                f"customer ids on both), {r.get('connect_charged', '?')} with one charge in their account")
        if r.get("bank_events"):
            w = r.get("webhooks") or {}
            log(f"   bank debits: {r['bank_events']} events, {r.get('bank_charged', '?')} charged after processing, "
                f"{r.get('bank_failed', '?')} failed after processing; webhooks: {w.get('events', '?')} events, "
                f"{w.get('attempts', '?')} attempts ({w.get('failed_attempts', '?')} not 2xx, "
                f"{w.get('duplicates', '?')} duplicated, {w.get('reordered', '?')} reordered, "
                f"{w.get('given_up', '?')} given up), {w.get('recorded', '?')} recorded; receiver killed "
                f"{w.get('receiver_kills', 0)} times")
        if r.get("corrections"):
            log(f"   corrections: {r['corrections']} periods corrected twice, {r.get('correction_refunds', '?')} "
                f"refunds, {r.get('corrections_moved_twice', '?')} moved twice; "
                f"{r.get('connect_corrections', 0)} of them of Connect events, "
                f"{r.get('corrected_twins_untouched', 0)} entries of corrected customer ids left whole")
        for msg in r["failures"][:20]:
            log(f"   FAIL {msg}")
        if not r["ok"]:
            log(f"   replay: {sys.argv[0]} --build {args.build} --seed {seed} --events {args.events} "
                f"--profile {profile} --duration {args.duration:g} --async-share {args.async_share:g}"
                + (f" --failover {args.failover}" if args.failover != "none" else "")
                + (f" --lose-commits {args.lose_commits}" if args.lose_commits else "")
                + (" --lose-account" if args.lose_account else "")
                + f"   (work dir kept: {r['work']})")
            totals["failed"].append(seed)
        if args.json:
            print(json.dumps({**r, "kills": dict(r["kills"])}), flush=True)
        totals["runs"] += 1
        totals["events"] += args.events
        totals["kills"].update(r["kills"])
        totals["kill_count"] += r["kill_count"]
        totals["charges"] += r.get("charges", 0)
        totals["duplicates"] += r.get("duplicates", 0)
        totals["uncharged"] += r.get("uncharged", 0)
        for k in ("pi_events", "pi_charged", "pi_declined"):
            totals[k] += r.get(k, 0)
        totals["fault_hits"].update(r.get("fault_hits") or {})
        totals["worst_quiescence_s"] = max(totals["worst_quiescence_s"], r.get("quiescence_s", 0.0))
    kills = ", ".join(f"{w} {totals['kills'].get(w, 0)}" for w in WINDOWS)
    log(f"== totals: {totals['runs']} runs, {totals['events']} events, {totals['kill_count']} kills (deliveries caught "
        f"at: {kills}), "
        f"{totals['charges']} charges, {totals['duplicates']} duplicates, {totals['uncharged']} uncharged, "
        f"worst time to quiescence {totals['worst_quiescence_s']} s, failed seeds {totals['failed'] or 'none'}")
    log(f"== PaymentIntents: {totals['pi_events']} events, {totals['pi_charged']} charged, "
        f"{totals['pi_declined']} declined; fault hits: "
        + ", ".join(f"{k} {v}" for k, v in sorted(totals["fault_hits"].items())))
    # The faults must reach the PaymentIntents endpoint too, or its exactly-once is not under test.
    missing = [k for k in ("fail_after_create", "drop_after_create", "rate_limit")
               if args.pi_share > 0 and totals["runs"] >= 3 and not totals["fault_hits"].get(f"{k} /v1/payment_intents")]
    if missing:
        log(f"== FAIL: no {', '.join(missing)} fault hit /v1/payment_intents in {totals['runs']} runs")
        return 1
    return 1 if totals["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
