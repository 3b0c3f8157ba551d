#!/usr/bin/env python3
"""Extracts the part of Stripe's published API description that chargeguard uses.

Source: github.com/stripe/openapi (MIT, see LICENSE-stripe-openapi.txt), openapi/spec3.yaml at a tag
(v524: API version 2023-08-16, the newest spec the repository's history keeps whole), and the official
Node SDK's types (npm `stripe`, MIT, see LICENSE-stripe-node.txt) for the pinned version 2024-06-20, whose
enums this keeps where the two differ. Writes:

  openapi-subset.json   the operations chargeguard calls (charges, payment_intents, refunds, disputes,
                        events: create, retrieve, list, search, cancel) and the schemas they answer with;
                        a schema outside the kept set stays a named stub (x-chargeguard-trimmed: any value)
  sdk-2024-06-20.json   the enums of the pinned version from the SDK's types

Run:  extract.py --openapi-git /path/to/stripe-openapi.git --tag v524 --sdk-tgz stripe-16.12.0.tgz
"""
import argparse
import json
import re
import subprocess
import sys
import tarfile

import yaml

OPERATIONS = {
    "/v1/charges": ["get", "post"],
    "/v1/charges/{charge}": ["get"],
    "/v1/charges/search": ["get"],
    "/v1/payment_intents": ["get", "post"],
    "/v1/payment_intents/{intent}": ["get"],
    "/v1/payment_intents/{intent}/cancel": ["post"],
    "/v1/payment_intents/search": ["get"],
    "/v1/refunds": ["get", "post"],
    "/v1/refunds/{refund}": ["get"],
    "/v1/disputes": ["get"],
    "/v1/disputes/{dispute}": ["get"],
    "/v1/events": ["get"],
    "/v1/events/{id}": ["get"],
}

# Schemas kept whole; any other schema they reference becomes a stub.
KEEP = {
    "charge", "payment_intent", "refund", "dispute", "event", "error", "api_errors",
    "notification_event_data", "notification_event_request", "billing_details", "address",
    "payment_method_details", "payment_method_details_ach_debit", "payment_method_details_us_bank_account",
    "dispute_evidence", "dispute_evidence_details", "payment_flows_automatic_payment_methods_payment_intent",
}

SDK_ENUMS = {
    # name: (file, namespace or None, type name)
    "charge.status": ("Charges.d.ts", "Charge", "Status"),
    "payment_intent.status": ("PaymentIntents.d.ts", "PaymentIntent", "Status"),
    "dispute.status": ("Disputes.d.ts", "Dispute", "Status"),
    "event.type": ("WebhookEndpointsResource.d.ts", "WebhookEndpointCreateParams", "EnabledEvent"),
    "error.type": ("Errors.d.ts", None, "RawErrorType"),
    # The error codes of the pinned version: the description of 2023-08-16 types api_errors.code as a free
    # string; the SDK's types for 2024-06-20 list them (the same list types every last_*_error.code).
    "error.code": ("PaymentIntents.d.ts", "PaymentIntent.LastPaymentError", "Code"),
}


def refs(node, out):
    if isinstance(node, dict):
        r = node.get("$ref")
        if isinstance(r, str) and r.startswith("#/components/schemas/"):
            out.add(r.rsplit("/", 1)[1])
        for v in node.values():
            refs(v, out)
    elif isinstance(node, list):
        for v in node:
            refs(v, out)


def subset(spec):
    paths = {}
    for path, methods in OPERATIONS.items():
        item = spec["paths"][path]
        paths[path] = {m: item[m] for m in methods}
    schemas_all = spec["components"]["schemas"]
    kept, stubs, todo = {}, {}, set()
    refs(paths, todo)
    while todo:
        name = todo.pop()
        if name in kept or name in stubs:
            continue
        if name in KEEP:
            kept[name] = schemas_all[name]
            found = set()
            refs(kept[name], found)
            todo |= found
        else:
            stubs[name] = {
                "x-chargeguard-trimmed": True,
                "description": "Left out of the subset: chargeguard neither sends nor reads it.",
            }
    schemas = dict(sorted({**kept, **stubs}.items()))
    hooks = spec["paths"]["/v1/webhook_endpoints"]["post"]["requestBody"]["content"][
        "application/x-www-form-urlencoded"]["schema"]["properties"]["enabled_events"]["items"]["enum"]
    return {"openapi": spec["openapi"], "info": spec["info"], "paths": paths,
            "components": {"schemas": schemas}, "x-chargeguard-event-types": sorted(hooks)}


def sdk_enums(tgz):
    out = {}
    with tarfile.open(tgz) as t:
        for name, (fname, ns, tname) in SDK_ENUMS.items():
            text = t.extractfile("package/types/" + fname).read().decode()
            depth = 0
            # The type inside `namespace <ns> {` (the resource's own, not a params namespace); a dotted ns
            # names nested namespaces, each two spaces further in.
            for part in ns.split(".") if ns else []:
                start = re.compile(r"\n" + " " * (4 + 2 * depth) + "namespace " + part + r" \{").search(text)
                if not start:
                    sys.exit(f"{name}: namespace {ns} not found in {fname}")
                text = text[start.end():]
                depth += 1
            # Directly in the innermost namespace, not a nested namespace's type of the same name.
            indent = " " * (4 + 2 * depth) if ns else "    export "
            m = re.search(r"\n" + indent + "type " + tname + r" =\s*((?:\s*\|?\s*'[^']*')+)\s*;", text)
            if not m:
                sys.exit(f"{name}: type {tname} not found in {fname}")
            out[name] = sorted(v for v in re.findall(r"'([^']*)'", m.group(1)) if v != "*")
        version = re.search(r"LatestApiVersion = '([^']+)'", t.extractfile("package/types/lib.d.ts").read().decode())
        pkg = json.loads(t.extractfile("package/package.json").read())
    return {"source": f"npm {pkg['name']} {pkg['version']} (types/*.d.ts), MIT",
            "api_version": version.group(1), "enums": out}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--openapi-git", required=True, help="git directory of github.com/stripe/openapi")
    ap.add_argument("--tag", default="v524")
    ap.add_argument("--sdk-tgz", required=True, help="npm pack stripe@16.12.0")
    ap.add_argument("--out-dir", default=".")
    a = ap.parse_args()
    git = ["git", "--git-dir", a.openapi_git]
    commit = subprocess.check_output(git + ["rev-parse", a.tag + "^{commit}"], text=True).strip()
    text = subprocess.check_output(git + ["show", f"{commit}:openapi/spec3.yaml"])
    spec = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    sub = subset(spec)
    sub["x-chargeguard-source"] = {
        "repository": "https://github.com/stripe/openapi",
        "tag": a.tag,
        "commit": commit,
        "path": "openapi/spec3.yaml",
        "api_version": spec["info"]["version"],
        "license": "MIT, Copyright (c) 2011- Stripe, Inc.; see LICENSE-stripe-openapi.txt",
        "extracted_by": "tests/conformance/stripe/extract.py",
    }
    with open(f"{a.out_dir}/openapi-subset.json", "w") as f:
        json.dump(sub, f, indent=1, sort_keys=False)
        f.write("\n")
    with open(f"{a.out_dir}/LICENSE-stripe-openapi.txt", "wb") as f:
        f.write(subprocess.check_output(git + ["show", f"{commit}:LICENSE"]))
    sdk = sdk_enums(a.sdk_tgz)
    with open(f"{a.out_dir}/sdk-2024-06-20.json", "w") as f:
        json.dump(sdk, f, indent=1)
        f.write("\n")
    with tarfile.open(a.sdk_tgz) as t, open(f"{a.out_dir}/LICENSE-stripe-node.txt", "wb") as f:
        f.write(t.extractfile("package/LICENSE").read())


if __name__ == "__main__":
    main()
