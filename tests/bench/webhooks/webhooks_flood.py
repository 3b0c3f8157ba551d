#!/usr/bin/env python3
"""Webhook receiver under a flood: what `chargeguard webhooks` holds when clients push bodies at it, and
whether genuine deliveries all end recorded when more arrive at once than it admits.

  * flood: --conns connections at once, each declaring a body of --body-kib KiB and sending it in 64 KiB
    writes; the receiver's peak RSS (VmHWM) is sampled, and the answers counted (503: over
    --max-buffered-bytes; 413: over --max-body-bytes; closed: shed before answering);
  * genuine: --deliveries distinct signed events at once, each retried after its Retry-After on 503, as
    Stripe does; every one must end 200 and be recorded once in stripe_webhook_events.

Real processes: the built chargeguard and PostgreSQL from PG* (a scratch database is created and dropped).

Usage: webhooks_flood [--build DIR] [--conns N] [--body-kib K] [--deliveries N] [--receiver-arg ARG]…
"""
import argparse, asyncio, hashlib, hmac, json, os, re, subprocess, sys, tempfile, time

SECRET = "whsec_bench_flood_secret"
MIB = 1024 * 1024


def vm(pid, field):
    """A /proc/PID/status field in KiB (VmRSS, VmHWM), or 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def wait_port(log_path, msg, proc, limit=60):
    pat = re.compile(r'"msg":"' + re.escape(msg) + r'"[^\n]*"port":([0-9]+)')
    t0 = time.time()
    while time.time() - t0 < limit:
        if proc.poll() is not None:
            sys.exit("receiver exited: " + open(log_path).read()[-2000:])
        m = pat.search(open(log_path).read())
        if m:
            return int(m.group(1))
        time.sleep(0.02)
    sys.exit(f"no '{msg}' in the receiver's log")


def signed(body):
    t = int(time.time())
    sig = hmac.new(SECRET.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={sig}"


async def read_status(reader, limit):
    """The status of the answer, or None when the connection closed (or the limit passed) first."""
    try:
        line = await asyncio.wait_for(reader.readline(), limit)
    except (asyncio.TimeoutError, ConnectionError):
        return None
    parts = line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


async def flooder(port, body_len, counts, gate):
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        counts["connect_failed"] = counts.get("connect_failed", 0) + 1
        return
    await gate.wait()
    head = (f"POST /stripe/webhooks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Stripe-Signature: t=1,v1={'0' * 64}\r\nContent-Length: {body_len}\r\n\r\n").encode()
    chunk = b"x" * 65536
    # The answer is read while the body is still being sent: a shed connection is answered early.
    answer = asyncio.create_task(read_status(reader, 60))
    try:
        writer.write(head)
        sent = 0
        while sent < body_len and not answer.done():
            n = min(len(chunk), body_len - sent)
            writer.write(chunk[:n])
            await asyncio.wait_for(writer.drain(), 30)
            sent += n
    except (ConnectionError, asyncio.TimeoutError):
        pass
    status = await answer
    key = str(status) if status else "closed"
    counts[key] = counts.get(key, 0) + 1
    writer.close()


async def deliver(port, i, stats):
    body = json.dumps({"id": f"evt_bench_{i}", "object": "event", "api_version": "2024-06-20",
                       "type": "customer.created", "created": int(time.time()), "livemode": False,
                       "data": {"object": {"id": f"cus_bench_{i}", "object": "customer"}}},
                      separators=(",", ":")).encode()
    tries = 0
    while True:
        tries += 1
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write((f"POST /stripe/webhooks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Stripe-Signature: {signed(body)}\r\nContent-Length: {len(body)}\r\n"
                      f"Connection: close\r\n\r\n").encode() + body)
        await writer.drain()
        raw = await reader.read()
        writer.close()
        head = raw.split(b"\r\n\r\n", 1)[0].decode(errors="replace")
        status = int(head.split()[1]) if head.startswith("HTTP/1.1") else 0
        if status == 200:
            stats["retried"] += tries > 1
            return
        if status != 503 or tries > 50:
            stats["failed"] += 1
            return
        stats["503"] += 1
        m = re.search(r"(?im)^retry-after:\s*(\d+)", head)
        await asyncio.sleep(int(m.group(1)) if m else 1)


async def main_async(a, port, pid):
    peak = {"rss": 0}
    done = asyncio.Event()

    async def sampler():
        while not done.is_set():
            peak["rss"] = max(peak["rss"], vm(pid, "VmRSS"))
            await asyncio.sleep(0.01)

    s = asyncio.create_task(sampler())
    counts = {}
    gate = asyncio.Event()
    t0 = time.time()
    conns = [asyncio.create_task(flooder(port, a.body_kib * 1024, counts, gate)) for _ in range(a.conns)]
    await asyncio.sleep(0.5)  # let the connects land, then every client sends at once
    gate.set()
    await asyncio.gather(*conns)
    flood_s = time.time() - t0
    flood_peak = max(peak["rss"], vm(pid, "VmHWM"))

    stats = {"retried": 0, "503": 0, "failed": 0}
    t1 = time.time()
    await asyncio.gather(*(deliver(port, i, stats) for i in range(a.deliveries)))
    genuine_s = time.time() - t1
    done.set()
    await s
    return counts, flood_s, flood_peak, stats, genuine_s


def psql(db, sql):
    return subprocess.run(["psql", "-tA", "-d", db, "-c", sql], check=True, capture_output=True,
                          text=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "..", "..", "build"))
    ap.add_argument("--conns", type=int, default=1000)
    ap.add_argument("--body-kib", type=int, default=1024)
    ap.add_argument("--deliveries", type=int, default=400)
    ap.add_argument("--receiver-arg", action="append", default=[])
    a = ap.parse_args()
    exe = os.path.join(a.build, "src", "app", "chargeguard")
    db = f"cg_webhooks_flood_{os.getpid()}"
    subprocess.run(["createdb", db], check=True)
    log = tempfile.NamedTemporaryFile(prefix="cg-webhooks-flood-", suffix=".log", delete=False)
    env = dict(os.environ, CHARGEGUARD_WEBHOOK_SECRET=SECRET)
    args = [exe, "webhooks", "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0", "--pg-dsn",
            f"dbname={db}", "--migrate", "--max-connections", str(a.conns + 100)]
    proc = subprocess.Popen(args + a.receiver_arg, stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        port = wait_port(log.name, "webhook receiver listening", proc)
        base = vm(proc.pid, "VmRSS")
        counts, flood_s, peak, stats, genuine_s = asyncio.run(main_async(a, port, proc.pid))
        recorded = int(psql(db, "SELECT count(*) FROM stripe_webhook_events"))
        alive = proc.poll() is None
        print(f"receiver args: {' '.join(a.receiver_arg) or '(defaults)'}")
        print(f"flood: {a.conns} connections x {a.body_kib} KiB in {flood_s:.1f} s; answers {counts}")
        print(f"RSS: {base / 1024:.1f} MiB idle, peak {peak / 1024:.1f} MiB during the flood")
        print(f"genuine: {a.deliveries} deliveries in {genuine_s:.1f} s; {recorded} recorded; "
              f"{stats['retried']} needed a retry ({stats['503']} answers 503); {stats['failed']} failed")
        print(f"receiver alive: {alive}")
        ok = alive and recorded == a.deliveries and stats["failed"] == 0
        sys.exit(0 if ok else 1)
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["dropdb", "--force", db], check=False)
        if not os.environ.get("CG_KEEP_LOGS"):
            os.unlink(log.name)


if __name__ == "__main__":
    main()
