#!/usr/bin/env python3
"""PostgreSQL CPU per proxied create, for the statements `chargeguard proxy` sends (issue 9 benchmark).

One backend, no proxy, no network load: BATCHES batches of SIZE creates of one vault key; each batch after the
first also settles (as Stripe's 2xx would) the previous batch's SIZE rows, the way the proxy of that binary
does it:
  * migration 0008 (no cg_vault_settle_many): the settlements ride in the same cg_vault_step call;
  * migration 0009: cg_vault_step(reservations) plus one cg_vault_settle_many(settlements).
Prints the backend's user+system CPU (from /proc/<pid>/stat, so the backend must run on this machine) per
create. CPU time, not wall time: it holds on a machine other jobs keep busy.

Usage: pg_step_cpu.py CHARGEGUARD_EXE [BATCHES] [SIZE]   (PGHOST/PGPORT/PGUSER as for psql; a scratch
database is created and dropped)
"""
import os
import subprocess
import sys
import tempfile


def psql(db, sql, *extra):
    return subprocess.run(["psql", "-X", "-q", "-At", "-d", db, *extra, "-c", sql], check=True,
                          capture_output=True, text=True).stdout.strip()


def arr(xs, kind="text"):
    return "ARRAY[" + ",".join("'" + x + "'" if kind == "text" else str(x) for x in xs) + "]::" + kind + "[]"


def main():
    exe = sys.argv[1]
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 600
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    db = f"cg_pg_step_cpu_{os.getpid()}"
    psql("postgres", f"CREATE DATABASE {db}")
    try:
        env = dict(os.environ, PGDATABASE=db, STRIPE_API_KEY="sk_test_unused")
        subprocess.run([exe, "migrate"], env=env, check=True, capture_output=True)
        subprocess.run([exe, "vault", "issue", "--name", "bench", "--period", "2026-11", "--currency", "usd",
                        "--expected-total-cents", "900000000000000"], env=env, check=True, capture_output=True)
        key = psql(db, "SELECT id FROM vault_keys")
        quick = psql(db, "SELECT count(*) FROM pg_proc WHERE proname = 'cg_vault_settle_many'") == "1"
        body = ("amount=1999&currency=usd&customer=cus_bench&description=bench&metadata[billing_key]=bk&"
                "metadata[chargeguard_vault_idempotency_key]=")
        none5 = "'{}', '{}', '{}', '{}', '{}'"
        # Prepared, as the proxy's statement cache does (the literals are still parsed per EXECUTE).
        stmts = ["PREPARE step(text, text[], text[], text[], text[], bigint[], text[], bigint[], text[], text[], "
                 "text[], bigint) AS SELECT * FROM cg_vault_step($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12);"]
        if quick:
            stmts.append("PREPARE settle_many(text[], text[], text[]) AS "
                         "SELECT * FROM cg_vault_settle_many($1, $2, $3);")
        prev = []
        for b in range(batches + 1):
            idems = [f"b{b}-{i}" for i in range(size)]
            res = (f"{arr(idems)}, {arr([1999] * size, 'bigint')}, {arr(['/v1/charges'] * size)}, "
                   f"{arr([body + i for i in idems])}, {arr(['cus_bench'] * size)}, 82800")
            if prev and not quick:
                s = (f"{arr(prev)}, {arr(['settled'] * size)}, {arr(['ch_' + p for p in prev])}, "
                     f"{arr([''] * size)}, {arr([0] * size, 'bigint')}")
                stmts.append(f"EXECUTE step('{key}', {s}, {res});")
            else:
                stmts.append(f"EXECUTE step('{key}', {none5}, {res});")
                if prev:
                    stmts.append(f"EXECUTE settle_many({arr([key] * size)}, {arr(prev)}, "
                                 f"{arr(['ch_' + p for p in prev])});")
            prev = idems
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "run.sql")
            cpu0, cpu1 = os.path.join(tmp, "cpu0"), os.path.join(tmp, "cpu1")
            with open(script, "w") as f:
                f.write("SELECT pg_backend_pid() AS pid \\gset\n\\setenv BPID :pid\n")
                f.write(f"\\! awk '{{print $14 + $15}}' /proc/$BPID/stat > {cpu0}\n\\o /dev/null\n")
                f.write("\n".join(stmts) + "\n\\o\n")
                f.write(f"\\! awk '{{print $14 + $15}}' /proc/$BPID/stat > {cpu1}\n")
            subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db, "-f", script], check=True,
                           capture_output=True)
            ticks = int(open(cpu1).read()) - int(open(cpu0).read())
        creates = (batches + 1) * size
        states = psql(db, "SELECT string_agg(state || '=' || n, ' ' ORDER BY state) FROM "
                          "(SELECT state, count(*) n FROM vault_spend GROUP BY state) s")
        per = ticks / os.sysconf("SC_CLK_TCK") * 1e6 / creates
        print(f"pg_step_cpu: {'0009 step + settle_many' if quick else '0008 step with settlements'}, "
              f"{batches + 1} batches of {size}: {per:.0f} µs of backend CPU per create ({states})")
    finally:
        psql("postgres", f"DROP DATABASE IF EXISTS {db}")


if __name__ == "__main__":
    main()
