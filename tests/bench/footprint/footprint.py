#!/usr/bin/env python3
"""Footprint benchmark: what a sidecar's resource request is written from, for `consume` and `proxy`.

  * start → /readyz 200 with PostgreSQL and nsqd already up (goal ≤ 1 s): the first start (it migrates) and
    the median of --starts later ones (schema there), polled every 5 ms;
  * idle CPU over --idle seconds with its connections open (goal < 0.2 % of a core), with the voluntary
    context switches per second (an idle timer shows there);
  * peak RSS (VmHWM) at --max-in-flight 2500 with 4 KiB bodies (goal ≤ 40 MiB on every run): consume
    charging 4 × 2 500 events of 4 KiB against fake-stripe answering in 300 ms; the proxy holding 2 500
    concurrent 4 KiB POST /v1/charges against fake-stripe answering in 1 s.
Real processes: the built chargeguard, NSQD_BIN (or fake-nsqd), fake-stripe, PostgreSQL from PG*.

Usage: footprint [--only consume|proxy] [--idle SECONDS] [--starts N] [--build DIR]
"""
import argparse, asyncio, json, os, signal, socket, statistics, subprocess
import sys, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from harness import load, load_harness  # noqa: E402 (the path above first)

H = load_harness()
CONSUME_ARGS = []  # --consume-arg
MAX_IN_FLIGHT = [2500]
MIB = 1024 * 1024


def ready(port):
    """GET /readyz over a raw socket (no urllib set-up per poll): True on 200."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def time_to_ready(p, port, limit=30):
    t0 = time.time()
    while time.time() - t0 < limit:
        if ready(port):
            return time.time() - t0
        if p.poll() is not None:
            raise RuntimeError(f"exited with {p.returncode} before ready")
        time.sleep(0.005)
    raise RuntimeError("not ready in time")


def ctx_switches(pid):
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:") or line.startswith("nonvoluntary_ctxt_switches:"):
                    n += int(line.split()[1])
    return n


def idle(pid, seconds):
    cpu0, cs0, t0 = H.proc_cpu(pid), ctx_switches(pid), time.time()
    time.sleep(seconds)
    wall = time.time() - t0
    return (H.proc_cpu(pid) - cpu0) / wall * 100, (ctx_switches(pid) - cs0) / wall, wall


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def hwm(pid):
    return H.proc_usage(pid)[1]


def verdict(ok):
    return "yes" if ok else "NO"


def consume_argv(st, health, extra):
    return [os.path.join(st.build, "src/app/chargeguard"), "consume", "--topic", "billing", "--channel",
            "chargeguard", "--nsqd-tcp-address", f"127.0.0.1:{st.nsq_tcp}", "--migrate", "--stripe-api-base",
            f"https://127.0.0.1:{st.stripe_port}", "--stripe-ca-file", os.path.join(st.certs, "ca.pem"),
            "--health-listen", f"127.0.0.1:{health}", "--key-namespace", "bench", *extra]


def big_events(n, prefix):
    """Events whose JSON body is 4 KiB: a 400-character description and an unknown padding field."""
    evs = H.events(n, prefix)
    for e in evs:
        e["description"] = "d" * 400
        e["padding"] = ""
        e["padding"] = "p" * (4096 - len(json.dumps(e)))
    return evs


def consume_footprint(build, idle_s, starts):
    st = H.stack(build, "fpc")
    rows = []
    try:
        st.fake_stripe(300)
        st.nsqd()
        env = dict(os.environ, STRIPE_API_KEY="sk_test_bench", PGDATABASE=st.db, CHARGEGUARD_LOG_LEVEL="warn")
        args = ["--max-in-flight", str(MAX_IN_FLIGHT[0]), "--stripe-rate-initial", "0", "--stripe-request-timeout", "30",
                *CONSUME_ARGS]
        times = []
        for i in range(starts + 1):
            health = H.free_port()
            p = st.spawn(consume_argv(st, health, args), env=env, log=f"consume-start-{i}")
            times.append(time_to_ready(p, health))
            if i < starts:
                p.send_signal(signal.SIGTERM)
                p.wait(30)
        first, later = times[0], statistics.median(times[1:]) if starts else float("nan")
        rows.append(("consume", "start → /readyz 200 (first start, migrates)", f"{first * 1000:.0f} ms", "≤ 1 s",
                     verdict(first <= 1)))
        rows.append(("consume", f"start → /readyz 200 (median of {starts}, schema present)",
                     f"{later * 1000:.0f} ms (all: {', '.join(f'{t * 1000:.0f}' for t in times[1:])})", "≤ 1 s",
                     verdict(later <= 1)))
        # Connections open: nsqd subscribed, the pool's PostgreSQL connections, Stripe connections from a few
        # charges.
        st.publish(H.events(20, "warm"))
        H.wait_for(lambda: st.charged() >= 20, 60, "20 warm-up charges")
        time.sleep(2)
        pct, cs, wall = idle(p.pid, idle_s)
        rows.append(("consume", f"idle CPU over {wall:.0f} s, connections open ({threads(p.pid)} threads)",
                     f"{pct:.3f} % of a core, {cs:.1f} context switches/s", "< 0.2 %", verdict(pct < 0.2)))
        n = max(4 * MAX_IN_FLIGHT[0], 2000)
        evs = big_events(n, "big")
        body = len(json.dumps(evs[0]))
        t0 = time.time()
        st.publish(evs)
        got = H.wait_charged(st, n + 20)
        peak = hwm(p.pid)
        m = H.metrics(health)
        conns = H.counter(m, "chargeguard_stripe_tls_handshakes_total")
        rows.append(("consume", f"peak RSS, --max-in-flight {MAX_IN_FLIGHT[0]}, {n} events of {body} B, Stripe 300 ms "
                     f"({got - 20} charged in {time.time() - t0:.1f} s; {conns:.0f} Stripe TLS handshakes)", f"{peak:.1f} MiB", "≤ 40 MiB",
                     verdict(peak <= 40)))
    finally:
        st.close()
    return rows


async def hold_requests(port, secret, n, body_bytes):
    """n concurrent POST /v1/charges of body_bytes each, every one on its own connection; returns statuses."""
    async def one(i):
        form = f"amount=1999&currency=usd&customer=cus_{i % 997}&description="
        body = (form + "x" * (body_bytes - len(form))).encode()
        head = (f"POST /v1/charges HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {secret}\r\n"
                f"Idempotency-Key: fp-{os.getpid()}-{i}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        for attempt in range(20):
            try:
                r, w = await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.05 * (attempt + 1))
        w.write(head + body)
        await w.drain()
        line = await r.readline()
        await r.read()
        w.close()
        return line.split()[1].decode() if len(line.split()) > 1 else "?"
    return await asyncio.gather(*(one(i) for i in range(n)))


def proxy_footprint(build, idle_s, starts):
    st = H.stack(build, "fpp")
    rows = []
    try:
        st.fake_stripe(0)
        exe = os.path.join(build, "src/app/chargeguard")
        env = dict(os.environ, STRIPE_API_KEY="sk_test_bench_real_key", PGDATABASE=st.db)
        subprocess.run([exe, "migrate"], env=env, check=True, capture_output=True)
        secret = subprocess.run([exe, "vault", "issue", "--name", "bench", "--period", "2026-11", "--currency", "usd",
                                 "--expected-total-cents", "900000000000000"], env=env, check=True,
                                capture_output=True, text=True).stdout.strip()
        times = []
        for i in range(starts + 1):
            listen, health = H.free_port(), H.free_port()
            p = st.spawn([exe, "--log-level", "warn", "proxy", "--listen", f"127.0.0.1:{listen}", "--upstream",
                          f"https://127.0.0.1:{st.stripe_port}", "--stripe-ca-file", os.path.join(st.certs, "ca.pem"),
                          "--health-listen", f"127.0.0.1:{health}", "--max-connections", "4096"],
                         env=env, log=f"proxy-start-{i}")
            times.append(time_to_ready(p, health))
            if i < starts:
                p.send_signal(signal.SIGTERM)
                p.wait(30)
        later = statistics.median(times[1:]) if starts else times[0]
        rows.append(("proxy", f"start → /readyz 200 (first; then median of {starts})",
                     f"{times[0] * 1000:.0f} ms; {later * 1000:.0f} ms (all: "
                     f"{', '.join(f'{t * 1000:.0f}' for t in times[1:])})", "≤ 1 s", verdict(max(times[0], later) <= 1)))
        # Connections open: a few requests through keep-alive client connections (and so upstream ones), held.
        socks = []
        for i in range(4):
            s = socket.create_connection(("127.0.0.1", listen))
            body = b"amount=1999&currency=usd&customer=cus_1"
            s.sendall(f"POST /v1/charges HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\nIdempotency-Key: "
                      f"idle-{i}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}"
                      "\r\n\r\n".encode() + body)
            s.recv(65536)
            socks.append(s)
        time.sleep(2)
        pct, cs, wall = idle(p.pid, idle_s)
        rows.append(("proxy", f"idle CPU over {wall:.0f} s, 4 client + upstream connections open "
                     f"({threads(p.pid)} threads)", f"{pct:.3f} % of a core, {cs:.1f} context switches/s", "< 0.2 %",
                     verdict(pct < 0.2)))
        for s in socks:
            s.close()
        # fake-stripe's latency is fixed per process: a second one answering in 1 s for the held requests.
        slow = subprocess.Popen([os.path.join(build, "tests/doubles/stripe/fake-stripe"), "--listen", "127.0.0.1:0",
                                 "--cert", os.path.join(st.certs, "server.pem"), "--key",
                                 os.path.join(st.certs, "server.key"), "--latency-ms", "1000"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        st.procs.append(slow)
        slow_port = int(slow.stdout.readline().decode().rsplit(":", 1)[1])
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        listen, health = H.free_port(), H.free_port()
        p = st.spawn([exe, "--log-level", "warn", "proxy", "--listen", f"127.0.0.1:{listen}", "--upstream",
                      f"https://127.0.0.1:{slow_port}", "--stripe-ca-file", os.path.join(st.certs, "ca.pem"),
                      "--health-listen", f"127.0.0.1:{health}", "--max-connections", "4096"], env=env, log="proxy-rss")
        time_to_ready(p, health)
        n = 2500
        t0 = time.time()
        statuses = asyncio.run(hold_requests(listen, secret, n, 4096))
        peak = hwm(p.pid)
        counts = {}
        for s in statuses:
            counts[s] = counts.get(s, 0) + 1
        rows.append(("proxy", f"peak RSS, {n} concurrent 4 KiB POSTs, Stripe 1 s ({time.time() - t0:.1f} s; "
                     f"statuses {counts})", f"{peak:.1f} MiB", "≤ 40 MiB", verdict(peak <= 40)))
    finally:
        st.close()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["consume", "proxy"])
    ap.add_argument("--idle", type=float, default=60)
    ap.add_argument("--starts", type=int, default=4)
    ap.add_argument("--max-in-flight", type=int, default=2500, help="consume's, for the peak RSS")
    ap.add_argument("--consume-arg", action="append", default=[], help="extra consume flag (repeatable)")
    ap.add_argument("--build", default=os.path.abspath(os.path.join(HERE, "../../..")))
    a = ap.parse_args()
    CONSUME_ARGS[:] = a.consume_arg
    MAX_IN_FLIGHT[0] = a.max_in_flight
    if not H.pg_configured():
        return 0
    print(f"footprint: load (1/5/15 min) {load()}, {os.cpu_count()} CPUs")
    rows = []
    if a.only in (None, "consume"):
        rows += consume_footprint(a.build, a.idle, a.starts)
    if a.only in (None, "proxy"):
        rows += proxy_footprint(a.build, a.idle, a.starts)
    print("| command | figure | measured | goal | met? |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"load at the end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
