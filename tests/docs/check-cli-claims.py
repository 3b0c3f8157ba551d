#!/usr/bin/env python3
"""What docs/operating/cli.md (and configuration.md, runbook.md) say about the CLI, asserted on the binary:
- the exit-code table of cli.md is the one `chargeguard --help` prints;
- a bad value names where it came from: the flag on the command line (exit 64), the CHARGEGUARD_* variable
  from the environment (exit 78), also for CLI11's own conversion errors;
- an unreadable, missing or malformed Stripe key file is a configuration error (exit 78) naming its source
  (the flag or CHARGEGUARD_STRIPE_KEY_FILE) and, when permissions are the cause, the uid the process runs as;
- `--msg-timeout` outside 0 and 1s..15m is refused; a misspelled flag is named with a suggestion;
- `consume --validate` reaches PostgreSQL, nsqd and Stripe once: exit 0, or 78 naming what failed;
- `/readyz` never says "ok startup" while `/startupz` waits; SIGHUP drains and exits 129;
- the runbook's psql confirm queries run on the migrated schema;
- `probe` prints the status and the whole body and exits 0 on 2xx, 1 otherwise; a bare path asks the
  listener CHARGEGUARD_HEALTH_LISTEN names.
usage: check-cli-claims.py SOURCE_ROOT CHARGEGUARD_EXE"""
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

root, exe = sys.argv[1], sys.argv[2]
fail = []
base = ["consume", "--topic", "t", "--channel", "c", "--nsqd-tcp-address", "127.0.0.1:1",
        "--pg-startup-timeout", "1s"]
clean_env = {k: v for k, v in os.environ.items()
             if not k.startswith("CHARGEGUARD_") and k not in ("STRIPE_API_KEY",)}
clean_env.update({"PGHOST": "127.0.0.1", "PGPORT": "1"})
clean_env["STRIPE_API_KEY"] = "sk_test_cli_claims"


def run(args, env=None, user=None):
    e = dict(clean_env, **(env or {}))
    cmd = [exe, *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout + p.stderr


def expect(what, got, code, *needles, absent=()):
    rc, out = got
    if rc != code:
        fail.append(f"{what}: exit {rc}, documented {code}: {out.strip()[:300]}")
    for n in needles:
        if n not in out:
            fail.append(f"{what}: output lacks {n!r}: {out.strip()[:300]}")
    for n in absent:
        if n in out:
            fail.append(f"{what}: output has {n!r}: {out.strip()[:300]}")


# The exit-code table.
cli_md = open(os.path.join(root, "docs/operating/cli.md")).read()
doc_codes = set(re.findall(r"^\| (\d+) \|", cli_md.split("## Exit codes")[1].split("\n## ")[0], re.M))
help_codes = set(re.findall(r"^  (\d+) ", run(["--help"])[1], re.M))
if doc_codes != help_codes or not doc_codes:
    fail.append(f"cli.md's exit codes {sorted(doc_codes)} are not --help's {sorted(help_codes)}")

# Where a bad value came from.
expect("CHARGEGUARD_MAX_IN_FLIGHT=abc", run(base, {"CHARGEGUARD_MAX_IN_FLIGHT": "abc"}), 78,
       "CHARGEGUARD_MAX_IN_FLIGHT", absent=("--max-in-flight",))
expect("--max-in-flight abc", run(base + ["--max-in-flight", "abc"]), 64, "--max-in-flight")
expect("CHARGEGUARD_SHUTDOWN_TIMEOUT=abc", run(base, {"CHARGEGUARD_SHUTDOWN_TIMEOUT": "abc"}), 78,
       "CHARGEGUARD_SHUTDOWN_TIMEOUT=abc: not a duration")
expect("--shutdown-timeout abc", run(base + ["--shutdown-timeout", "abc"]), 64, "--shutdown-timeout abc: not a duration")
expect("--msg-timeout 500ms", run(base + ["--msg-timeout", "500ms"]), 64, "--msg-timeout 500ms: out of range")
expect("CHARGEGUARD_MSG_TIMEOUT=16m", run(base, {"CHARGEGUARD_MSG_TIMEOUT": "16m"}), 78, "CHARGEGUARD_MSG_TIMEOUT=16m")

# A misspelled flag is named, with the nearest real one, before any "required" complaint it causes.
expect("--topci", run(["consume", "--topci", "billing", "--channel", "c"]), 64,
       "unknown flag --topci (did you mean --topic?)", absent=("--topic is required",))

# The Stripe key file.
tmp = tempfile.mkdtemp()
try:
    missing = os.path.join(tmp, "missing")
    expect("CHARGEGUARD_STRIPE_KEY_FILE missing", run(base, {"CHARGEGUARD_STRIPE_KEY_FILE": missing}), 78,
           f"CHARGEGUARD_STRIPE_KEY_FILE '{missing}'", "No such file", absent=("--stripe-key-file",))
    expect("--stripe-key-file missing", run(base + ["--stripe-key-file", missing]), 78,
           f"--stripe-key-file '{missing}'")
    bad = os.path.join(tmp, "bad")
    open(bad, "w").write("hello_not_a_key\n")
    expect("a key file holding no key", run(base + ["--stripe-key-file", bad]), 78, "is not a Stripe secret",
           absent=("hello_not_a_key",))
    if os.getuid() == 0 and shutil.which("setpriv"):
        os.chmod(tmp, 0o755)
        key = os.path.join(tmp, "key")
        open(key, "w").write("sk_test_cli_claims\n")
        os.chmod(key, 0o400)  # root's, as a host file mounted into the container without a mode change
        expect("a key file the user cannot read", run(base, {"CHARGEGUARD_STRIPE_KEY_FILE": key}, user=10001), 78,
               "Permission denied (this process runs as uid 10001)")
finally:
    shutil.rmtree(tmp)


# probe: the whole body, exit by status, a bare path on the configured listener.
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok postgres: connected\nFAIL nsq: no subscribed connection\nok startup: started\n"
        self.send_response(503 if self.path == "/readyz" else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


srv = http.server.HTTPServer(("127.0.0.1", 0), Health)
threading.Thread(target=srv.serve_forever, daemon=True).start()
port = srv.server_address[1]
expect("probe /readyz (503)", run(["probe", "/readyz"], {"CHARGEGUARD_HEALTH_LISTEN": f"0.0.0.0:{port}"}), 1,
       f"127.0.0.1:{port}/readyz: 503", "ok postgres: connected", "FAIL nsq: no subscribed connection", "ok startup")
expect("probe URL (200)", run(["probe", f"http://127.0.0.1:{port}/healthz"]), 0, "200", "FAIL nsq")
srv.shutdown()

# consume --validate: every dependency reached once, exit 0; any unreachable one named, exit 78. Needs the
# PostgreSQL server the suite runs with (PGHOST) and fake-stripe; nsqd is a plain TCP listener here.
fake, certs = os.environ.get("FAKE_STRIPE_EXE"), os.environ.get("CG_TEST_CERTS")
if os.environ.get("PGHOST") and fake and certs:
    import socket
    nsqd = socket.socket()
    nsqd.bind(("127.0.0.1", 0))
    nsqd.listen(4)
    fs = subprocess.Popen([fake, "--listen", "127.0.0.1:0", "--cert", f"{certs}/server.pem", "--key",
                           f"{certs}/server.key"], stdout=subprocess.PIPE, text=True)
    try:
        port = None
        for line in fs.stdout:
            m = re.search(r"listening on [0-9.]+:(\d+)", line)
            if m:
                port = m.group(1)
                break
        args = ["consume", "--topic", "billing", "--channel", "c", "--stripe-api-base", f"https://127.0.0.1:{port}",
                "--stripe-ca-file", f"{certs}/ca.pem", "--validate"]
        pg = {k: os.environ[k] for k in ("PGHOST", "PGPORT", "PGUSER", "PGDATABASE") if k in os.environ}
        expect("consume --validate", run(args + ["--nsqd-tcp-address", f"127.0.0.1:{nsqd.getsockname()[1]}"], pg),
               0, "ok   postgres", "ok   nsqd", "ok   stripe", '"msg":"consume starting"', absent=("sk_test_cli_claims",))
        expect("consume --validate, nothing reachable",
               run(args + ["--nsqd-tcp-address", "127.0.0.1:1"], dict(pg, PGPORT="1")), 78,
               "FAIL postgres", "FAIL nsqd 127.0.0.1:1: connecting: Connection refused", "ok   stripe")
        # /readyz never says "ok startup" while /startupz still waits: PostgreSQL reached, nsqd not. Then
        # SIGHUP: the drain, and exit 129 (process.md "Signals"), not 0.
        db = f"cg_doc_claims_{os.getpid()}"
        pgenv = dict(os.environ, **pg)
        subprocess.run(["psql", "-q", "-d", "postgres", "-c", f"CREATE DATABASE {db}"], env=pgenv, check=True)
        try:
            hs = socket.socket()
            hs.bind(("127.0.0.1", 0))
            hport = hs.getsockname()[1]
            hs.close()
            import signal
            import time
            import urllib.error
            import urllib.request

            def get(path):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{hport}{path}", timeout=2) as r:
                        return r.status, r.read().decode()
                except urllib.error.HTTPError as e:
                    return e.code, e.read().decode()
                except OSError:
                    return 0, ""

            proc = subprocess.Popen(
                [exe, "consume", "--topic", "billing", "--channel", "c", "--nsqd-tcp-address", "127.0.0.1:1",
                 "--migrate", "--health-listen", f"127.0.0.1:{hport}", "--stripe-api-base",
                 f"https://127.0.0.1:{port}", "--stripe-ca-file", f"{certs}/ca.pem"],
                env={**clean_env, **pg, "PGDATABASE": db}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            ready = (0, "")
            for _ in range(200):
                ready = get("/readyz")
                if "ok postgres" in ready[1]:
                    break
                time.sleep(0.1)
            if "ok postgres" not in ready[1]:
                fail.append(f"consume never reached PostgreSQL: /readyz {ready}")
            started = get("/startupz")
            if started[0] != 503 or "WAIT nsq" not in started[1]:
                fail.append(f"/startupz with nsqd unreachable: {started}")
            ready = get("/readyz")
            if ready[0] != 503 or "FAIL startup" not in ready[1] or "ok startup" in ready[1]:
                fail.append(f"/readyz while /startupz waits for nsq says: {ready}")
            proc.send_signal(signal.SIGHUP)
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = None
            err = proc.stderr.read()
            if code != 129 or '"reason":"SIGHUP"' not in err:
                fail.append(f"consume after SIGHUP: exit {code}, documented 129: {err[-300:]}")
            # The runbook's ledger queries (its `psql -c "…"` confirm steps), run as written against the
            # migrated schema: a renamed column or table fails here. `migrate` first: /readyz reports
            # PostgreSQL reached before consume's own --migrate has finished, and SIGHUP may stop it there.
            mig = subprocess.run([exe, "migrate"], env={**clean_env, **pg, "PGDATABASE": db},
                                 capture_output=True, text=True)
            if mig.returncode != 0:
                fail.append(f"chargeguard migrate: exit {mig.returncode}: {mig.stderr.strip()[-300:]}")
            runbook = open(os.path.join(root, "docs/operating/runbook.md")).read()
            queries = re.findall(r"`(psql (?:-c \"[^\"]+\" ?)+)`", runbook.replace("\n", " "))
            if len(queries) < 3:
                fail.append(f"runbook.md: expected its psql confirm steps, found {len(queries)}")
            for q in queries:
                r = subprocess.run(["bash", "-c", q], env={**pgenv, "PGDATABASE": db}, capture_output=True, text=True)
                if r.returncode != 0 or "ERROR" in r.stderr:
                    fail.append(f"runbook.md's `{q[:60]}…` fails on the migrated schema: {r.stderr.strip()[:200]}")
        finally:
            subprocess.run(["psql", "-q", "-d", "postgres", "-c", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"],
                           env=pgenv)
    finally:
        fs.kill()
        nsqd.close()
else:
    print("consume --validate part skipped: PGHOST, FAKE_STRIPE_EXE or CG_TEST_CERTS not set")

for f in fail:
    print("FAIL:", f)
if fail:
    sys.exit(1)
print("ok: exit codes, value origins, key-file errors, --msg-timeout bounds and probe behave as documented")
