#!/usr/bin/env python3
"""Payments that settle later, end to end: `chargeguard consume` and `chargeguard webhooks` on one ledger
(a throwaway PostgreSQL cluster), fake-nsqd, and fake-stripe delivering signed webhooks for bank debits
(Stripe's pm_usBankAccount_* test methods: processing, then succeeded or failed).

  1. in order: a debit that succeeds ends `charged` once; one that fails ends `failed_after_processing`
     with one dead letter; neither is ever charged twice or left processing;
  2. every event delivered twice and held back behind the next one about the same payment: the same ends;
  3. no webhook at all (the endpoint's events filtered out): the poll of rows left processing ends them;
  4. the create call's answer lost (500 after creating) and the bank already answered when the pipeline
     searches: a failed debit still ends failed_after_processing, not declined;
  5. a Charges-API bank debit (a customer whose default source is a bank account: payment_method_details
     ach_debit) answered `pending`: the row is `processing` holding the charge, then the bank's answer,
     delivered as charge.succeeded / charge.failed, is applied by the receiver: `charged` with that charge,
     or `failed_after_processing` with one dead letter; one charge at Stripe either way;
  6. disputes on charged rows, step by step through Stripe's lifecycle: an inquiry (warning_needs_response,
     warning_under_review, warning_closed) withdraws nothing; a chargeback (needs_response with
     funds_withdrawn, under_review by charge.dispute.updated, won with funds_reinstated, or lost) records
     the disputed amount; an inquiry escalated to a chargeback starts counting then; a PaymentIntent's
     charge disputed likewise. Every dispute event reaches the receiver and is acted on; the row stays
     `charged` with its one charge, and `explain` says what became of the dispute.
Each phase awaits conditions (the ledger, fake-stripe's delivery log), never a fixed sleep. nsqd is the real
daemon when NSQD_BIN names it, else fake-nsqd.

Usage: settle_later.py --build DIR [--keep]. Exit 0 when every phase held, 1 otherwise, 77 when it cannot run.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos  # noqa: E402  (the chaos test's process wrappers)


def failed_after_processing_metric(log_path):
    """chargeguard_billing_failed_after_processing_total on the /metrics of the process that wrote the log."""
    port = None
    for ln in chaos.read_log(log_path):
        if ln.get("msg") == "health server listening":
            port = ln.get("port")
    if not port:
        raise RuntimeError(f"no health port in {log_path}")
    with chaos.urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("chargeguard_billing_failed_after_processing_total "):
                return float(line.split()[1])
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if not shutil.which("psql") or not os.path.exists("/usr/lib/postgresql/15/bin/initdb"):
        print("skipped: needs PostgreSQL 15 (initdb, psql)")
        return 77
    for exe in ("src/app/chargeguard", "tests/doubles/stripe/fake-stripe", "tests/doubles/nsq/fake-nsqd"):
        if not os.path.exists(os.path.join(args.build, exe)):
            print(f"skipped: {exe} is not built in {args.build}")
            return 77

    work = tempfile.mkdtemp(prefix="cg-settle-later-")
    os.chmod(work, 0o755)
    failures = []
    pg = nsqd = stripe = hooks = cons = None
    t0 = time.monotonic()
    try:
        pg = chaos.Postgres(work)
        nsqd = chaos.Nsqd(work, args.build, os.environ.get("NSQD_BIN", ""))
        hooks = chaos.Webhooks(work, args.build, pg)
        stripe = chaos.Stripe(work, args.build, [], (), hooks.url(), (0, 0))
        cons = chaos.Consumers(work, args.build, nsqd, pg, stripe, chaos.PROFILES["short"], 1, 10)
        cons.bank = True
        cons.start(0)

        def event(cust, pm, amount):
            return chaos.json.dumps({"customer_id": cust, "billing_period": chaos.PERIOD, "amount_cents": amount,
                                     "currency": "usd", "stripe_customer_id": "cus_bank" + cust.replace("-", ""),
                                     "description": "settle later", "payment_method": pm})

        def rows(custs):
            keys = ",".join(f"'{chaos.billing_key(c)}'" for c in custs)
            return {r[0]: r[1:] for r in pg.query(
                "SELECT key, status, coalesce(charge_id, ''), coalesce(payment_intent_id, '') "
                f"FROM billing_records WHERE key IN ({keys})")}

        def final(custs):
            r = rows(custs)
            return len(r) == len(custs) and all(v[0] not in ("pending", "processing") for v in r.values())

        def check_phase(name, ok, fail, bound):
            custs = ok + fail
            if not chaos.wait_until(lambda: final(custs), bound, step=0.1):
                failures.append(f"{name}: not settled within {bound} s: {rows(custs)}")
                return
            charges = stripe.charges()
            intents = stripe.intents()
            letters = pg.query("SELECT coalesce(billing_key, ''), reason FROM dead_letters")
            got = rows(custs)
            for c in custs:
                key = chaos.billing_key(c)
                status, charge_id, intent_id = got[key]
                succeeded = [x["id"] for x in charges
                             if (x.get("metadata") or {}).get("billing_key") == key and x["status"] == "succeeded"]
                its = [p for p in intents if (p.get("metadata") or {}).get("billing_key") == key]
                mine = [r for k, r in letters if k == key]
                if len(its) != 1:
                    failures.append(f"{name} {c}: {len(its)} intents")
                if c in ok:
                    if status != "charged" or succeeded != [charge_id]:
                        failures.append(f"{name} {c}: ledger {status} {charge_id}, succeeded charges {succeeded}")
                    if mine:
                        failures.append(f"{name} {c}: charged but dead-lettered: {mine}")
                else:
                    if status != "failed_after_processing" or succeeded:
                        failures.append(f"{name} {c}: ledger {status}, succeeded charges {succeeded}")
                    if len(mine) != 1:
                        failures.append(f"{name} {c}: {len(mine)} dead letters, want 1")
            chaos.log(f"   {name}: " + ", ".join(f"{c} {got[chaos.billing_key(c)][0]}" for c in custs))

        bound = chaos.SETTLE_AFTER_MS / 1000 + chaos.POLL_AFTER_S + 20

        # 1. In order.
        nsqd.publish([event("ok-1", chaos.BANK_OK, 1200), event("fail-1", chaos.BANK_FAIL, 1300)])
        check_phase("in order", ["ok-1"], ["fail-1"], bound)

        # 2. Every event twice, and held back behind the next one about the same payment.
        stripe.admin("POST", "/_admin/webhooks", {"duplicate_pct": "100", "reorder_pct": "100",
                                                 "reorder_hold_ms": "3000"})
        before = stripe.deliveries()["stats"]
        nsqd.publish([event("ok-2", chaos.BANK_OK, 1400), event("fail-2", chaos.BANK_FAIL, 1500)])
        check_phase("duplicated and reordered", ["ok-2"], ["fail-2"], bound)
        stripe.webhooks_idle(15)
        after = stripe.deliveries()["stats"]
        if after["duplicates"] == before["duplicates"] or after["reordered"] == before["reordered"]:
            failures.append(f"faults did not fire: before {before}, after {after}")
        recorded = pg.query("SELECT count(*), count(DISTINCT id) FROM stripe_webhook_events")[0]
        if recorded[0] != recorded[1]:
            failures.append(f"webhook events recorded twice: {recorded}")

        # 3. No webhook: only the poll of rows left processing can end them.
        stripe.admin("POST", "/_admin/webhooks", {"duplicate_pct": "0", "reorder_pct": "0",
                                                 "enabled_events": "none.at_all"})
        nsqd.publish([event("ok-3", chaos.BANK_OK, 1600), event("fail-3", chaos.BANK_FAIL, 1700)])
        check_phase("no webhook (poll)", ["ok-3"], ["fail-3"], bound)

        # 4. The create call's answer lost (500 after creating), and the bank answers before the retry: the
        #    search finds the debit's charge already succeeded or failed — a failed one failed after processing.
        stripe.admin("POST", "/_admin/webhooks", {"enabled_events": "*"})
        stripe.admin("POST", "/_admin/async", {"settle_after_ms": "50"})
        stripe.faults(fail_after_create=2, fault_path="/v1/payment_intents")
        nsqd.publish([event("ok-4", chaos.BANK_OK, 1800), event("fail-4", chaos.BANK_FAIL, 1900)])
        check_phase("answer lost, settled before the search", ["ok-4"], ["fail-4"], bound)
        hits = stripe.fault_hits().get("fail_after_create /v1/payment_intents", 0)
        if hits != 2:
            failures.append(f"the lost answers did not happen: {hits} fail_after_create hits")

        # 5. A Charges-API bank debit: the customer's default source is a bank account, so /v1/charges answers
        #    a `pending` charge (ach_debit). The bank answers only when told to, so the row is seen processing
        #    first; the answer then comes as charge.succeeded / charge.failed, and the receiver applies it.
        stripe.admin("POST", "/_admin/async", {"settle_after_ms": "3600000"})
        ach = {"ach-ok": ("cus_achok5", "succeeded", 2100), "ach-fail": ("cus_achfail5", "failed", 2200)}
        for cust, (scus, _, _) in ach.items():
            stripe.admin("POST", "/_admin/customers", {"customer": scus, "default_source": "ba_1" + scus})
        nsqd.publish([chaos.json.dumps({"customer_id": c, "billing_period": chaos.PERIOD, "amount_cents": amt,
                                        "currency": "usd", "stripe_customer_id": scus,
                                        "description": "settle later (charges api)"})
                      for c, (scus, _, amt) in ach.items()])
        keys = {c: chaos.billing_key(c) for c in ach}

        def ach_charges(key):
            return [x for x in stripe.charges() if (x.get("metadata") or {}).get("billing_key") == key]

        def ach_processing():
            got = rows(list(ach))
            return len(got) == len(ach) and all(v[0] == "processing" and v[1] for v in got.values())

        if not chaos.wait_until(ach_processing, bound, step=0.1):
            failures.append(f"charges api debit: not processing within {bound} s: {rows(list(ach))}")
        else:
            held = rows(list(ach))
            for c, key in keys.items():
                status, charge_id, intent_id = held[key]
                mine = ach_charges(key)
                if intent_id or [x["id"] for x in mine] != [charge_id] or mine[0]["status"] != "pending" or \
                        (mine[0].get("payment_method_details") or {}).get("type") != "ach_debit":
                    failures.append(f"charges api debit {c}: row {held[key]}, charges at Stripe {mine}")
            for c, (scus, outcome, _) in ach.items():
                form = {"charge": held[keys[c]][1], "outcome": outcome}
                if outcome == "failed":
                    form["failure_code"] = "insufficient_funds"
                stripe.admin("POST", "/_admin/settle", form)
            if not chaos.wait_until(lambda: final(list(ach)), bound, step=0.1):
                failures.append(f"charges api debit: not settled within {bound} s: {rows(list(ach))}")
            got = rows(list(ach))
            letters = pg.query("SELECT coalesce(billing_key, ''), reason FROM dead_letters")
            for c, (scus, outcome, _) in ach.items():
                key = keys[c]
                charge_id = held[key][1]
                want = "charged" if outcome == "succeeded" else "failed_after_processing"
                mine = ach_charges(key)
                if got[key] != [want, charge_id, ""]:
                    failures.append(f"charges api debit {c}: ledger {got[key]}, want {want} with {charge_id}")
                if [(x["id"], x["status"]) for x in mine] != [(charge_id, outcome)]:
                    failures.append(f"charges api debit {c}: charges at Stripe {mine}, want {charge_id} {outcome}")
                # The receiver applied the bank's answer (not the poll): the event moved this row.
                applied = pg.query("SELECT outcome, coalesce(applied_to, '') FROM stripe_webhook_events "
                                   f"WHERE type = 'charge.{outcome}' AND object_id = '{charge_id}'")
                if applied != [["applied", key]]:
                    failures.append(f"charges api debit {c}: charge.{outcome} recorded as {applied}")
                n_letters = len([r for k, r in letters if k == key])
                if n_letters != (1 if outcome == "failed" else 0):
                    failures.append(f"charges api debit {c}: {n_letters} dead letters")
            chaos.log("   charges api debit: " + ", ".join(f"{c} {got[keys[c]][0]}" for c in ach))
        stripe.admin("POST", "/_admin/async", {"settle_after_ms": str(chaos.SETTLE_AFTER_MS)})

        # 6. Disputes on charged card rows, one step at a time, each step awaited in the ledger as the docs
        #    say it reads: (status, disputed_cents) after it, and the events it makes.
        lifecycles = {
            "inquiry": (True, [("warning_under_review", 0, ["charge.dispute.updated"]),
                               ("warning_closed", 0, ["charge.dispute.closed"])]),
            "won": (False, [("under_review", 1, ["charge.dispute.updated"]),
                            ("won", 1, ["charge.dispute.closed", "charge.dispute.funds_reinstated"])]),
            "lost": (False, [("under_review", 1, ["charge.dispute.updated"]),
                             ("lost", 1, ["charge.dispute.closed"])]),
            "escalated": (True, [("needs_response", 1,
                                  ["charge.dispute.updated", "charge.dispute.funds_withdrawn"]),
                                 ("lost", 1, ["charge.dispute.closed"])]),
            # Paid by a PaymentIntent: the dispute names the intent as well as its charge.
            "intent": (False, [("under_review", 1, ["charge.dispute.updated"]),
                               ("won", 1, ["charge.dispute.closed", "charge.dispute.funds_reinstated"])]),
        }
        dcust = {name: f"disp-{name}" for name in lifecycles}
        amounts = {name: 3000 + 100 * i for i, name in enumerate(lifecycles)}
        nsqd.publish([chaos.json.dumps({"customer_id": dcust[n], "billing_period": chaos.PERIOD,
                                        "amount_cents": amounts[n], "currency": "usd",
                                        "stripe_customer_id": "cus_disp" + n, "description": "disputed",
                                        **({"payment_method": "pm_disputed1"} if n == "intent" else {})})
                      for n in lifecycles])

        def dispute_row(name):
            r = pg.query("SELECT status, coalesce(charge_id, ''), disputed_cents, coalesce(dispute_status, '') "
                         f"FROM billing_records WHERE key = '{chaos.billing_key(dcust[name])}'")
            return r[0] if r else None

        def dispute_events(dispute_id):
            return pg.query("SELECT type, coalesce(outcome, '') FROM stripe_webhook_events "
                            f"WHERE object_id = '{dispute_id}' ORDER BY created, received_at")

        def step_to(name, dispute_id, status, withdrawn, n_events):
            want = ["charged", charged[name], str(amounts[name] if withdrawn else 0), status]
            ok = chaos.wait_until(lambda: dispute_row(name) == want and len(dispute_events(dispute_id)) == n_events
                                  and all(o for _, o in dispute_events(dispute_id)), 20, step=0.1)
            if not ok:
                failures.append(f"dispute {name}: at {status} the row is {dispute_row(name)}, want {want}; "
                                f"events {dispute_events(dispute_id)}, want {n_events}")
            return ok

        charged = {}
        if not chaos.wait_until(lambda: all((dispute_row(n) or [""])[0] == "charged" for n in lifecycles), bound,
                                step=0.1):
            failures.append(f"disputes: rows not charged: {[dispute_row(n) for n in lifecycles]}")
        else:
            charged = {n: dispute_row(n)[1] for n in lifecycles}
            for name, (inquiry, steps) in lifecycles.items():
                form = {"charge": charged[name]}
                if inquiry:
                    form["inquiry"] = "true"
                dp = stripe.admin("POST", "/_admin/disputes", form)["id"]
                want_types = ["charge.dispute.created"] + ([] if inquiry else ["charge.dispute.funds_withdrawn"])
                if not step_to(name, dp, "warning_needs_response" if inquiry else "needs_response", not inquiry,
                               len(want_types)):
                    continue
                for status, withdrawn, types in steps:
                    stripe.admin("POST", "/_admin/disputes/update", {"dispute": dp, "status": status})
                    want_types += types
                    if not step_to(name, dp, status, withdrawn, len(want_types)):
                        break
                got = dispute_events(dp)
                # Every event of the lifecycle reached the receiver once and was acted on (a status it already
                # recorded is no_change; never unknown_type).
                if sorted(t for t, _ in got) != sorted(want_types) or \
                        any(o not in ("applied", "no_change") for _, o in got):
                    failures.append(f"dispute {name}: events {got}, want {want_types} acted on")
                mine = [x for x in stripe.charges()
                        if (x.get("metadata") or {}).get("billing_key") == chaos.billing_key(dcust[name])]
                if [x["id"] for x in mine] != [charged[name]] or \
                        bool(mine[0].get("payment_intent")) != (name == "intent"):
                    failures.append(f"dispute {name}: charges at Stripe {mine}")
                # What an operator reads of it: `explain` calls an inquiry no dispute, and names how a
                # chargeback ended.
                x = chaos.subprocess.run([os.path.join(args.build, "src", "app", "chargeguard"), "explain",
                                          "--key", chaos.billing_key(dcust[name]), "--json"], env=pg.env,
                                         capture_output=True, text=True, timeout=60)
                verdict = chaos.json.loads(x.stdout).get("verdict", "") if x.returncode == 0 else x.stderr
                said = {"inquiry": "an inquiry closed without a dispute (warning_closed): no funds withdrawn",
                        "won": f"dispute won (won): the {amounts[name]} cents withdrawn came back",
                        "lost": f"dispute lost (lost): {amounts[name]} cents gone",
                        "escalated": f"dispute lost (lost): {amounts[name]} cents gone",
                        "intent": f"dispute won (won): the {amounts[name]} cents withdrawn came back"}[name]
                if not verdict.startswith("charged once: ") or not verdict.endswith("; " + said):
                    failures.append(f"dispute {name}: explain says {verdict!r}, want it to end {said!r}")
                chaos.log(f"   dispute {name}: " + " → ".join(t.rsplit('.', 1)[1] for t, _ in got) +
                          f"; row {dispute_row(name)}; explain: …{verdict[-60:]}")

        # The alert: every failure after processing counted once, by whichever process applied it (the
        # receiver for a webhook, the consumer for events recorded before it left the row processing, or
        # its poll).
        alerts = sum(failed_after_processing_metric(p) for p in (hooks.log_path(), cons.logs[0]))
        if alerts != 5:
            failures.append(f"chargeguard_billing_failed_after_processing_total sums to {alerts}, want 5")
    except Exception as e:
        failures.append(f"harness: {type(e).__name__}: {e}")
    finally:
        if cons:
            cons.stop_all()
        for x in (hooks, stripe, nsqd, pg):
            if x:
                try:
                    x.stop()
                except Exception:
                    pass
    for f in failures:
        chaos.log(f"FAIL {f}")
    chaos.log(f"settle-later end to end: {'ok' if not failures else 'FAILED'} in {time.monotonic() - t0:.1f} s"
              + (f" (work dir kept: {work})" if failures or args.keep else ""))
    if not failures and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
