#!/usr/bin/env python3
"""Vault proxy at production rates: open-loop Poisson arrivals (10, 50, 100 requests/s by default) of
POST /v1/charges, direct to fake-stripe over TLS and through `chargeguard proxy`, in the same run, with
fake-stripe answering in 50 ms and 300 ms. Direct and proxied alternate in 3 slices per setting so both see
the same background load. Latency is measured from each request's scheduled arrival (open loop: a late send
counts), on keep-alive connections opened as needed. Prints p50 / p99 / p99.9 of both paths, the added
latency at each (goal at 100/s: added p99 < 2 ms, added p99.9 < 5 ms), and the proxy's CPU per request
(from /proc). Needs PG* (a scratch database), the built chargeguard and fake-stripe.

With --sidecars N (default 3) N `consume` sidecars run beside the proxy the whole time, charging a backlog
through the same fake-stripe at --sidecar-rps each (--stripe-max-rps) and writing to the same PostgreSQL, as
in production. --trace runs the proxy at debug and prints, per setting, the proxied requests' stages (auth,
wait for the key's batch, reservation statement, to upstream, upstream, answer) at p50 / p99 / max and those
of the slowest 1 %.

Usage: proxy_poisson [--rate R]… [--latency MS]… [--seconds S] [--seed N] [--sidecars N] [--sidecar-rps R]
                     [--trace] [--build DIR]
"""
import argparse, asyncio, os, random, signal, ssl, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from harness import load, load_harness  # noqa: E402 (the path above first)

H = load_harness()


async def read_response(r):
    head = await r.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdr = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
    if "content-length" in hdr:
        await r.readexactly(int(hdr["content-length"]))
    elif hdr.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await r.readline()).split(b";")[0], 16)
            await r.readexactly(size + 2)
            if size == 0:
                break
    return status, hdr.get("connection", "").lower() != "close"


class path:
    def __init__(self, port, tls, auth):
        self.port, self.tls, self.auth, self.idle, self.opened = port, tls, auth, [], 0

    async def request(self, key):
        body = f"amount=1999&currency=usd&customer=cus_{hash(key) % 997}".encode()
        msg = (f"POST /v1/charges HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.auth}\r\n"
               f"Idempotency-Key: {key}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        while self.idle:  # a kept connection the server closed while idle: the next one, else a new one
            r, w = self.idle.pop()
            try:
                w.write(msg)
                status, keep = await read_response(r)
                break
            except (asyncio.IncompleteReadError, ConnectionError):
                w.close()
        else:
            self.opened += 1
            r, w = await asyncio.open_connection("127.0.0.1", self.port, ssl=self.tls,
                                                 server_hostname="localhost" if self.tls else None)
            w.write(msg)
            status, keep = await read_response(r)
        if keep:
            self.idle.append((r, w))
        else:
            w.close()
        return status

    def close(self):
        for _, w in self.idle:
            w.close()
        self.idle = []


async def poisson(p, rate, seconds, rng, tag):
    """Open-loop arrivals at `rate` for `seconds`; returns (latencies s, non-200 count)."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    lat, bad, tasks, t, i = [], [0], [], start, 0

    async def one(at, key):
        await asyncio.sleep(max(0.0, at - loop.time()))
        status = await p.request(key)
        lat.append(loop.time() - at)
        if status != 200:
            bad[0] += 1

    while True:
        t += rng.expovariate(rate)
        if t > start + seconds:
            break
        tasks.append(asyncio.ensure_future(one(t, f"{tag}-{i}")))
        i += 1
    await asyncio.gather(*tasks)
    return lat, bad[0]


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000 if xs else float("nan")


STAGES = ("auth_us", "parse_us", "wait_us", "stmt_us", "to_upstream_us", "upstream_us", "answer_us", "total_us")


def stage_lines(log_path, offset):
    """The proxy's "vault request stages" debug lines written since `offset`; (records, new offset)."""
    import json
    out = []
    with open(log_path, "rb") as f:
        f.seek(offset)
        data = f.read()
    for line in data.decode("utf-8", "replace").splitlines():
        if "vault request stages" not in line:
            continue
        try:
            rec = json.loads(line[line.index("{"):])
        except ValueError:
            continue
        rec = rec.get("fields", rec)
        if all(k in rec for k in STAGES):
            out.append(rec)
    return out, offset + len(data)


def stage_summary(recs):
    if not recs:
        return "no stage lines"
    parts = []
    slow = sorted(recs, key=lambda r: r["total_us"])[-max(1, len(recs) // 100):]
    for k in STAGES:
        xs = sorted(r[k] for r in recs)
        parts.append(f"{k[:-3]} {xs[len(xs) // 2] / 1000:.2f}/{xs[min(len(xs) - 1, int(0.99 * len(xs)))] / 1000:.2f}/"
                     f"{xs[-1] / 1000:.1f}")
    worst = "; ".join(", ".join(f"{k[:-3]} {r[k] / 1000:.1f}" for k in STAGES if k not in ("upstream_us",))
                      for r in slow[-3:])
    own = sorted(r["total_us"] - r["upstream_us"] for r in recs)  # what the proxy adds, per request
    at = lambda q: own[min(len(own) - 1, int(q * len(own)))] / 1000
    return (f"proxy's own time (total − upstream) p50/p99/p99.9/max {at(0.5):.2f}/{at(0.99):.2f}/{at(0.999):.2f}/"
            f"{own[-1] / 1000:.1f} ms; stages ms p50/p99/max: " + ", ".join(parts) + f" — slowest: {worst}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, action="append")
    ap.add_argument("--latency", type=int, action="append")
    ap.add_argument("--seconds", type=float, default=30, help="per path and setting (3 slices)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sidecars", type=int, default=3, help="consume sidecars charging beside the proxy")
    ap.add_argument("--sidecar-rps", type=float, default=25, help="each sidecar's --stripe-max-rps")
    ap.add_argument("--trace", action="store_true", help="proxy at debug: print the stages per setting")
    ap.add_argument("--build", default=os.path.abspath(os.path.join(HERE, "../../..")))
    a = ap.parse_args()
    if not H.pg_configured():
        return 0
    rates, lats = a.rate or [10, 50, 100], a.latency or [50, 300]
    rng = random.Random(a.seed)
    st = H.stack(a.build, "poisson")
    try:
        st.fake_stripe(0)
        if a.sidecars:
            # A backlog that lasts the whole run: every setting's warm-up and slices, at every sidecar's rate.
            total_s = len(rates) * len(lats) * (2 + 2 * a.seconds) + 60
            st.nsqd()
            for i in range(a.sidecars):
                st.consume(i, ["--stripe-max-rps", f"{a.sidecar_rps:g}", "--max-in-flight", "200"])
            st.publish(H.events(int(a.sidecars * a.sidecar_rps * total_s), "pp"))
        exe = os.path.join(a.build, "src/app/chargeguard")
        key = "sk_test_bench_real_key"
        env = dict(os.environ, STRIPE_API_KEY=key, PGDATABASE=st.db)
        subprocess.run([exe, "migrate"], env=env, check=True, capture_output=True)
        secret = subprocess.run([exe, "vault", "issue", "--name", "bench", "--period", "2026-11", "--currency", "usd",
                                 "--expected-total-cents", "900000000000000"], env=env, check=True,
                                capture_output=True, text=True).stdout.strip()
        listen, health = H.free_port(), H.free_port()
        proxy = st.spawn([exe, "--log-level", "debug" if a.trace else "warn", "proxy", "--listen", f"127.0.0.1:{listen}", "--upstream",
                          f"https://127.0.0.1:{st.stripe_port}", "--stripe-ca-file", os.path.join(st.certs, "ca.pem"),
                          "--health-listen", f"127.0.0.1:{health}"], env=env, log="proxy")
        H.wait_for(lambda: H.http_ok(f"http://127.0.0.1:{health}/readyz"), 30, "proxy ready")
        tls = ssl.create_default_context(cafile=os.path.join(st.certs, "ca.pem"))
        print(f"proxy at production rates: Poisson arrivals, {a.seconds:g} s per path and setting in 3 alternating "
              f"slices; {a.sidecars} consume sidecars beside it at ≤ {a.sidecar_rps:g} charges/s each; "
              f"load {load()}, {os.cpu_count()} CPUs")
        proxy_log, log_at = os.path.join(st.tmp, "proxy.log"), 0
        print("| Stripe | rate/s | direct p50 / p99 / p99.9 ms | proxied p50 / p99 / p99.9 ms | added p50 / p99 / p99.9 ms "
              "| goal (100/s: p99 < 2, p99.9 < 5) | proxy CPU-ms / request | requests (non-200) | load |")
        print("|---|---|---|---|---|---|---|---|---|")

        async def run_all():
            nonlocal log_at
            direct, via = path(st.stripe_port, tls, key), path(listen, None, secret)
            for lat in lats:
                st.stripe_admin("/_admin/faults", {"latency_ms": lat})
                for rate in rates:
                    await poisson(direct, rate, 1, rng, f"wd-{lat}-{rate}")  # warm both paths
                    await poisson(via, rate, 1, rng, f"wp-{lat}-{rate}")
                    d, p, bad, cpu = [], [], 0, 0.0
                    opened = (direct.opened, via.opened)
                    if a.trace:
                        _, log_at = stage_lines(proxy_log, log_at)
                    for s in range(3):
                        x, b1 = await poisson(direct, rate, a.seconds / 3, rng, f"d-{lat}-{rate}-{s}")
                        c0 = H.proc_cpu(proxy.pid)
                        y, b2 = await poisson(via, rate, a.seconds / 3, rng, f"p-{lat}-{rate}-{s}")
                        cpu += H.proc_cpu(proxy.pid) - c0
                        d += x
                        p += y
                        bad += b1 + b2
                    dq, pq = [q(d, x) for x in (0.5, 0.99, 0.999)], [q(p, x) for x in (0.5, 0.99, 0.999)]
                    added = [pp - dd for pp, dd in zip(pq, dq)]
                    goal = ("yes" if added[1] < 2 and added[2] < 5 else "NO") if rate >= 100 else "—"
                    print(f"| {lat} ms | {rate:g} | {' / '.join(f'{v:.1f}' for v in dq)} | "
                          f"{' / '.join(f'{v:.1f}' for v in pq)} | {' / '.join(f'{v:+.1f}' for v in added)} | {goal} | "
                          f"{cpu / max(1, len(p)) * 1000:.3f} | {len(d)} + {len(p)} ({bad}) | {load()} |", flush=True)
                    slow = sorted(p)[-max(1, len(p) // 100):]
                    print(f"|   | | connections opened: direct {direct.opened - opened[0]}, to the proxy "
                          f"{via.opened - opened[1]}; slowest 1 % proxied: {', '.join(f'{x * 1000:.0f}' for x in slow[-8:])} ms "
                          "| | | | | | |", flush=True)
                    if a.trace:
                        recs, log_at = stage_lines(proxy_log, log_at)
                        print(f"|   | | {stage_summary(recs)} | | | | | | |", flush=True)
            direct.close()
            via.close()

        asyncio.run(run_all())
        print("(p99.9 of fewer than 1 000 requests is the slowest few; CPU-ms per request counts ticks of 10 ms)")
    finally:
        st.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
