#!/usr/bin/env python3
"""chargeguard against Stripe's published API description (openapi-subset.json, see extract.py).

(a) every request chargeguard's code builds (captured by stripe_conformance_capture from fake-stripe's
    request log) names an operation of the description, with only its parameters, of their types and enum
    values, the required ones present, and the pinned Stripe-Version;
(b) every field the code reads (reads.tsv: object, field, type) exists in the schema with that type, and
    every value the description (2023-08-16) or the pinned version's SDK types (2024-06-20) define for an
    enum the code reads has a row in verdicts.tsv whose verdict is what the code makes of it (asked of the
    code itself through the capture program); event types the code acts on exist in both;
(c) every object fake-stripe answered or put in an event validates against the schema: no field the schema
    lacks, every required one present, types, nullability and enums as described; every error code it
    answers with is one of the pinned version's (the SDK's list: the description types code as a string);
(d) every error code the vault proxy can answer with (read from src/vault: the literals its refusals are
    built with) is one of the pinned version's, or one of the vault's own listed in vault-codes.tsv, and
    docs/operating/vault.md names each.

Usage: check.py --capture EXE --certs DIR --root SOURCE_ROOT
Exit 1 with one line per violation.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))


class Spec:
    def __init__(self, doc):
        self.doc = doc
        self.schemas = doc["components"]["schemas"]

    def resolve(self, s):
        while isinstance(s, dict) and "$ref" in s:
            s = self.schemas[s["$ref"].rsplit("/", 1)[1]]
        return s

    def operation(self, method, path):
        for template, item in self.doc["paths"].items():
            pattern = "^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"
            if re.match(pattern, path) and method.lower() in item:
                # a literal path (/v1/charges/search) wins over a template (/v1/charges/{charge})
                literal = [t for t in self.doc["paths"] if t == path and method.lower() in self.doc["paths"][t]]
                if literal:
                    return literal[0], self.doc["paths"][literal[0]][method.lower()]
                return template, item[method.lower()]
        return None, None


def json_type_ok(value, t):
    return {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }.get(t, True)


def validate(spec, value, schema, where, errors):
    """A JSON value against an OpenAPI 3.0 schema (the subset Stripe's description uses)."""
    schema = spec.resolve(schema)
    if schema.get("x-chargeguard-trimmed"):
        return
    if value is None:
        if not schema.get("nullable"):
            errors.append(f"{where}: null, the schema does not allow it")
        return
    if "anyOf" in schema:
        for alt in schema["anyOf"]:
            trial = []
            validate(spec, value, alt, where, trial)
            if not trial:
                return
        errors.append(f"{where}: {json.dumps(value)[:80]} matches none of anyOf")
        return
    t = schema.get("type")
    if t and not json_type_ok(value, t):
        errors.append(f"{where}: {json.dumps(value)[:80]} is not {t}")
        return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {json.dumps(value)} not in enum {schema['enum']}")
    if isinstance(value, str) and "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(f"{where}: longer than {schema['maxLength']}")
    if isinstance(value, list):
        for i, item in enumerate(value):
            validate(spec, item, schema.get("items", {}), f"{where}[{i}]", errors)
    if isinstance(value, dict) and (t == "object" or "properties" in schema):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if k in props:
                validate(spec, v, props[k], f"{where}.{k}", errors)
            elif isinstance(extra, dict):
                validate(spec, v, extra, f"{where}.{k}", errors)
            elif extra is not True and props:
                errors.append(f"{where}.{k}: no such field in the schema")
        for k in schema.get("required", []):
            if k not in value:
                errors.append(f"{where}: required field {k} missing")


def parse_form(text):
    """A form body or query string into nested dicts/lists as Stripe reads it (a[b]=1, a[]=x)."""
    root = {}
    for k, v in urllib.parse.parse_qsl(text, keep_blank_values=True):
        parts = re.findall(r"^[^\[]+|\[([^\]]*)\]", k)
        head = re.match(r"^[^\[]+", k).group(0)
        keys = [head] + [p for p in re.findall(r"\[([^\]]*)\]", k)]
        node = root
        for i, key in enumerate(keys):
            last = i == len(keys) - 1
            if isinstance(node, list):
                if last:
                    node.append(v)
                else:
                    node.append({})
                    node = node[-1]
                continue
            if last:
                if key in node:
                    raise ValueError(f"parameter {k} given twice")
                node[key] = v
            else:
                nxt = keys[i + 1]
                node = node.setdefault(key, [] if nxt == "" else {})
        del parts
    return root


def validate_param(spec, value, schema, where, errors):
    """A form-encoded value (strings, nested) against a parameter schema."""
    schema = spec.resolve(schema)
    if "anyOf" in schema:
        for alt in schema["anyOf"]:
            trial = []
            validate_param(spec, value, alt, where, trial)
            if not trial:
                return
        errors.append(f"{where}: {json.dumps(value)[:80]} matches none of anyOf")
        return
    t = schema.get("type")
    if t == "object":
        if not isinstance(value, dict):
            errors.append(f"{where}: {json.dumps(value)[:60]} is not an object")
            return
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        for k, v in value.items():
            if k in props:
                validate_param(spec, v, props[k], f"{where}[{k}]", errors)
            elif isinstance(extra, dict):
                validate_param(spec, v, extra, f"{where}[{k}]", errors)
            elif extra is not True:
                errors.append(f"{where}[{k}]: no such parameter")
        for k in schema.get("required", []):
            if k not in value:
                errors.append(f"{where}: required {k} missing")
        return
    if t == "array":
        if not isinstance(value, list):
            errors.append(f"{where}: not an array")
            return
        for i, v in enumerate(value):
            validate_param(spec, v, schema.get("items", {}), f"{where}[{i}]", errors)
        return
    if not isinstance(value, str):
        errors.append(f"{where}: {json.dumps(value)[:60]} is not a scalar")
        return
    if t == "integer" and not re.fullmatch(r"-?[0-9]+", value):
        errors.append(f"{where}: {value!r} is not an integer")
    if t == "boolean" and value not in ("true", "false"):
        errors.append(f"{where}: {value!r} is not a boolean")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in enum {schema['enum']}")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(f"{where}: longer than {schema['maxLength']}")


def check_request(spec, r, pinned, errors):
    where = f"{r['method']} {r['path']}"
    template, op = spec.operation(r["method"], r["path"])
    if not op:
        errors.append(f"(a) {where}: no such operation in the description")
        return None
    if r["stripe_version"] != pinned:
        errors.append(f"(a) {where}: Stripe-Version {r['stripe_version']!r}, pinned {pinned}")
    try:
        if r["method"] == "GET":
            params = {p["name"]: p for p in op.get("parameters", []) if p["in"] == "query"}
            given = parse_form(r["query"])
            for k, v in given.items():
                if k not in params:
                    errors.append(f"(a) {where}: query parameter {k} not in the description")
                else:
                    validate_param(spec, v, params[k]["schema"], f"(a) {where} ?{k}", errors)
            for k, p in params.items():
                if p.get("required") and k not in given:
                    errors.append(f"(a) {where}: required query parameter {k} missing")
        else:
            body = op["requestBody"]["content"]["application/x-www-form-urlencoded"]["schema"]
            validate_param(spec, parse_form(r["body"]), body, f"(a) {where} body", errors)
    except ValueError as e:
        errors.append(f"(a) {where}: {e}")
    return op


def response_schema(op, status):
    resp = op["responses"].get(str(status)) or op["responses"].get("default")
    return resp["content"]["application/json"]["schema"]


def field_schema(spec, obj, path):
    """The schema of `path` (a.b.c) in schema or operation `obj`; None when absent."""
    if obj.startswith("GET ") or obj.startswith("POST "):
        method, p = obj.split(" ", 1)
        _, op = spec.operation(method, p)
        s = response_schema(op, 200)
    else:
        s = spec.schemas.get(obj)
    for part in path.split("."):
        s = spec.resolve(s)
        if s is None:
            return None
        if "anyOf" in s:  # an expandable field: look into the object alternative
            objs = [spec.resolve(a) for a in s["anyOf"] if "properties" in spec.resolve(a)]
            s = objs[0] if objs else s
        s = s.get("properties", {}).get(part)
    return s


def schema_types(spec, s):
    s = spec.resolve(s)
    if "anyOf" in s:
        out = set()
        for a in s["anyOf"]:
            a = spec.resolve(a)
            expandable = "properties" in a or a.get("x-chargeguard-trimmed")
            out |= {"id|object"} if expandable else schema_types(spec, a)
        if "id|object" in out:
            out |= {"string"}
        return out
    return {s.get("type", "any")} | ({"null"} if s.get("nullable") else set())


# How src/vault builds a refusal's code: bad("code", …) (policy.cpp's refusal bad()), {status, "type", "code", …}
# (refusals.cpp) and e.code = "code".
VAULT_CODE_PATTERNS = [
    re.compile(r'\bbad\(\s*"([a-z_]*)"'),
    re.compile(r'\{\s*\d{3},\s*"(?:api_error|card_error|idempotency_error|invalid_request_error)",\s*"([a-z_]*)"'),
    re.compile(r'\.code\s*=\s*"([a-z_]*)"'),
]


def vault_codes(root):
    """{code: [file:line, …]} of every non-empty error code literal src/vault builds a refusal with."""
    out = {}
    vault = os.path.join(root, "src", "vault")
    for name in sorted(os.listdir(vault)):
        if not name.endswith(".cpp"):
            continue
        text = open(os.path.join(vault, name)).read()
        for i, pat in enumerate(VAULT_CODE_PATTERNS):
            if i == 0 and "refusal bad(" not in text:
                continue  # another file's bad() (cap.cpp's parse errors) builds no refusal
            for m in pat.finditer(text):
                if m.group(1):
                    line = text.count("\n", 0, m.start()) + 1
                    out.setdefault(m.group(1), []).append(f"src/vault/{name}:{line}")
    return out


def check_vault_codes(root, stripe_codes, errors):
    own = {r[0]: r[1] for r in read_tsv(os.path.join(HERE, "vault-codes.tsv"))}
    found = vault_codes(root)
    if len(found) < 8:
        errors.append(f"(d) found only {len(found)} vault error codes in src/vault: the scan no longer matches "
                      "how refusals are built")
    doc = open(os.path.join(root, "docs", "operating", "vault.md")).read()
    for code, where in sorted(found.items()):
        if code not in stripe_codes and code not in own:
            errors.append(f"(d) the vault answers with code {code!r} ({', '.join(where)}): not one of Stripe's "
                          "for the pinned version nor the vault's own (vault-codes.tsv)")
        if f"`{code}`" not in doc:
            errors.append(f"(d) vault error code {code!r}: not in docs/operating/vault.md")
    for code in own:
        if code in stripe_codes:
            errors.append(f"(d) vault-codes.tsv lists {code!r}, which is Stripe's own: drop the row")
        if code not in found:
            errors.append(f"(d) vault-codes.tsv lists {code!r}, which the vault never answers with")
    return found


def read_tsv(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line and not line.startswith("#"):
                rows.append(line.split("\t"))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capture", required=True)
    ap.add_argument("--certs", required=True)
    ap.add_argument("--root", required=True)
    a = ap.parse_args()
    spec = Spec(json.load(open(os.path.join(HERE, "openapi-subset.json"))))
    sdk = json.load(open(os.path.join(HERE, "sdk-2024-06-20.json")))
    pinned = sdk["api_version"]
    stripe_codes = set(sdk["enums"]["error.code"])
    errors = []

    out = subprocess.run([a.capture, a.certs], capture_output=True, text=True, timeout=100)
    if out.returncode != 0:
        print(out.stderr[-2000:])
        errors.append(f"capture exited {out.returncode}")
    lines, pos, dec = [], 0, json.JSONDecoder()  # events are pretty-printed: a stream of JSON values
    text = out.stdout
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        value, pos = dec.raw_decode(text, pos)
        lines.append(value)
    requests = [x for x in lines if x["kind"] == "request"]
    events = [x["body"] for x in lines if x["kind"] == "event"]
    own = [r for r in requests if r["origin"] == "chargeguard"]
    if len(own) < 10:
        errors.append(f"capture: only {len(own)} requests of chargeguard's own")

    # (a) and (c): chargeguard's requests, every answer.
    table = set()
    for r in requests:
        if r["origin"] == "chargeguard":
            op = check_request(spec, r, pinned, errors)
            keys = sorted(parse_form(r["query"] if r["method"] == "GET" else r["body"]).keys())
            table.add((r["method"], spec.operation(r["method"], r["path"])[0] or r["path"], ",".join(keys)))
        else:
            op = spec.operation(r["method"], r["path"])[1]
        if op and r["response"] is not None:
            validate(spec, r["response"], response_schema(op, r["status"]),
                     f"(c) {r['method']} {r['path']} → {r['status']}", errors)
        err = (r["response"] or {}).get("error") if isinstance(r["response"], dict) else None
        if isinstance(err, dict) and err.get("code") and err["code"] not in stripe_codes:
            errors.append(f"(c) {r['method']} {r['path']} → {r['status']}: error code {err['code']!r} is not one "
                          f"of API {pinned}")
    kinds = {"charge", "payment_intent", "refund", "dispute"}
    seen_objects = set()
    for e in events:
        validate(spec, e, {"$ref": "#/components/schemas/event"}, f"(c) event {e.get('type')}", errors)
        obj = e.get("data", {}).get("object", {})
        if obj.get("object") in kinds:
            seen_objects.add(obj["object"])
        # Every object with a schema of the subset (customer and payment_method are named stubs there:
        # their envelope and event types are checked, their fields are not).
        if obj.get("object") in spec.schemas:
            validate(spec, obj, {"$ref": "#/components/schemas/" + obj["object"]},
                     f"(c) event {e.get('type')} data.object", errors)
        for source, types in (("2023-08-16", spec.doc["x-chargeguard-event-types"]),
                              (pinned, sdk["enums"]["event.type"])):
            if e.get("type") not in types:
                errors.append(f"(c) fake-stripe sent event type {e.get('type')}, not one of API {source}")
    if seen_objects != kinds:
        errors.append(f"(c) events sampled only {sorted(seen_objects)} of {sorted(kinds)}")

    # (b) fields read.
    for row in read_tsv(os.path.join(HERE, "reads.tsv")):
        obj, field, want = row[0], row[1], row[2]
        s = field_schema(spec, obj, field)
        if s is None:
            errors.append(f"(b) {obj}.{field}: read by the code, absent from the schema")
            continue
        have = schema_types(spec, s)
        if want not in have:
            errors.append(f"(b) {obj}.{field}: read as {want}, the schema says {sorted(have)}")

    # (b) enum values → verdicts.
    verdict_rows = read_tsv(os.path.join(HERE, "verdicts.tsv"))
    table_verdicts = {(r[0], r[1]): r[2] for r in verdict_rows}
    s = spec.schemas
    enums = {
        "charge.status": (s["charge"]["properties"]["status"]["enum"], sdk["enums"]["charge.status"]),
        "payment_intent.status": (s["payment_intent"]["properties"]["status"]["enum"],
                                  sdk["enums"]["payment_intent.status"]),
        "dispute.status": (s["dispute"]["properties"]["status"]["enum"], sdk["enums"]["dispute.status"]),
        "error.type": (s["api_errors"]["properties"]["type"]["enum"], s["api_errors"]["properties"]["type"]["enum"]),
    }
    ask = []
    for name, (old, new) in enums.items():
        for v in sorted(set(old) | set(new)):
            ask.append((name, v))
            if (name, v) not in table_verdicts:
                where = "both" if v in old and v in new else ("2023-08-16 only" if v in old else f"{pinned} only")
                errors.append(f"(b) {name} {v!r} ({where}): no verdict in verdicts.tsv")
        for (n, v) in table_verdicts:
            if n == name and v not in old and v not in new:
                errors.append(f"(b) {name} {v!r}: in verdicts.tsv, not a value of the API")
    events_handled = [(r[0], r[1]) for r in verdict_rows if r[0] == "event.type"]
    for _, v in events_handled:
        ask.append(("event.type", v))
        for source, types in (("2023-08-16", spec.doc["x-chargeguard-event-types"]),
                              (pinned, sdk["enums"]["event.type"])):
            if v not in types:
                errors.append(f"(b) event type {v!r}: not an event type of API {source}")
    # Every type the code acts on must be in the table: ask the code about every type of the API.
    all_types = sorted(set(spec.doc["x-chargeguard-event-types"]) | set(sdk["enums"]["event.type"]) |
                       {"refund.failed"})
    ask += [("event.type", t) for t in all_types if ("event.type", t) not in set(events_handled)]
    with tempfile.NamedTemporaryFile("w", suffix=".tsv", delete=False) as f:
        f.write("".join(f"{n}\t{v}\n" for n, v in ask))
        ask_file = f.name
    got = subprocess.run([a.capture, a.certs, "--verdicts", ask_file], capture_output=True, text=True, timeout=60)
    os.unlink(ask_file)
    for line in got.stdout.splitlines():
        x = json.loads(line)
        key = (x["enum"], x["value"])
        if key in table_verdicts:
            if table_verdicts[key] != x["verdict"]:
                errors.append(f"(b) {x['enum']} {x['value']!r}: verdicts.tsv says {table_verdicts[key]}, "
                              f"the code says {x['verdict']}")
        elif x["enum"] == "event.type" and x["verdict"] != "unknown_type":
            errors.append(f"(b) event type {x['value']!r}: acted on by the code ({x['verdict']}) "
                          f"but not in verdicts.tsv")
    # refund.status: the description lists the values in prose (no enum); the verdict is the SQL rank.
    desc = s["refund"]["properties"]["status"]["description"]
    refund_values = sorted(set(re.findall(r"`([a-z_]+)`", desc)))
    sql = open(os.path.join(a.root, "migrations", "0016_refunds.sql")).read()
    case = re.search(r"cg_refund_status_rank.*?SELECT CASE (.*?) END", sql, re.S).group(1)
    def rank(v):
        for cond, r in re.findall(r"WHEN (status [^T]*?) THEN (\d)", case):
            if ("IN" in cond and f"'{v}'" in cond) or cond.strip() == f"status = '{v}'":
                return {"3": "given_back", "2": "refunded", "1": "standing"}[r]
        return {"3": "given_back", "2": "refunded", "1": "standing"}[re.search(r"ELSE (\d)", case).group(1)]
    for v in refund_values:
        if ("refund.status", v) not in table_verdicts:
            errors.append(f"(b) refund.status {v!r}: no verdict in verdicts.tsv")
        elif table_verdicts[("refund.status", v)] != rank(v):
            errors.append(f"(b) refund.status {v!r}: verdicts.tsv says {table_verdicts[('refund.status', v)]}, "
                          f"cg_refund_status_rank says {rank(v)}")

    # (d) the vault proxy's error codes.
    vault = check_vault_codes(a.root, stripe_codes, errors)

    print(f"{len(own)} requests of chargeguard's, {len(requests) - len(own)} sampled, {len(events)} events, "
          f"{len(read_tsv(os.path.join(HERE, 'reads.tsv')))} fields read, {len(verdict_rows)} verdicts")
    print("vault error codes: " + ", ".join(f"{c} ({'Stripe' if c in stripe_codes else 'vault'})"
                                            for c in sorted(vault)))
    print("request table (method, operation, parameters):")
    for m, p, k in sorted(table):
        print(f"  {m} {p}  {k}")
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
