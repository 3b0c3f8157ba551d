#!/usr/bin/env python3
"""Sums test results into the one line CI reads: "N passed, N failed[, N skipped]".

Arguments: pairs of meson testlog.json and JUnit directory (written by ci/junit-wrap). A Boost.Test
executable counts its test cases; any other test counts as one. A test that meson saw fail while its
cases all passed (a crash at exit, a sanitizer report, a timeout) adds one failure.
Each pair's own counts go to stderr (one line per tree and repetition: `ci/test --repeat N`).
Exit status 1 when anything failed or nothing ran."""
import json
import os
import sys
import xml.etree.ElementTree as ET


def junit_failures(path):
    """(case name, first lines of its failure text) for each failed case in a JUnit report."""
    out = []
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return out
    for case in root.iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            text = (bad.get("message") or "") + "\n" + (bad.text or "")
            out.append((case.get("name"), "\n".join(text.strip().splitlines()[:8])))
    return out


def report_failure(t, xml):
    """Say which cases failed and why, so a CI log is enough to start diagnosing."""
    for name, text in junit_failures(xml) if xml else []:
        print(f"  case {name}:", file=sys.stderr)
        for line in text.splitlines():
            print(f"    {line}", file=sys.stderr)
    for stream in ("stdout", "stderr"):
        tail = (t.get(stream) or "").splitlines()[-30:]
        if tail:
            print(f"  last lines of {t['name']} ({stream}):", file=sys.stderr)
            for line in tail:
                print(f"    {line}", file=sys.stderr)


def junit_counts(path):
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
    p = f = s = 0
    for suite in suites:
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                f += 1
            elif case.find("skipped") is not None:
                s += 1
            else:
                p += 1
    return p, f, s


passed = failed = skipped = 0
args = sys.argv[1:]
for testlog, junit_dir in zip(args[0::2], args[1::2]):
    before = (passed, failed, skipped)
    if not os.path.exists(testlog):  # a stage that never ran its tests (its log says why)
        print(f"{testlog}: missing, counted as one failure", file=sys.stderr)
        failed += 1
        continue
    with open(testlog) as fh:
        for line in fh:
            if not line.strip():
                continue
            t = json.loads(line)
            result = t["result"]
            # The command starts with ci/junit-wrap; the report is named after the test executable.
            xml = next((x for x in (os.path.join(junit_dir, os.path.basename(c) + ".xml")
                                    for c in t.get("command") or []) if os.path.exists(x)), "")
            ok = result in ("OK", "EXPECTEDFAIL")
            if result == "SKIP":
                skipped += 1
                continue
            if xml:
                try:
                    p, f, s = junit_counts(xml)
                except ET.ParseError:
                    p, f, s = 0, 1, 0
                passed, failed, skipped = passed + p, failed + f, skipped + s
                if not ok and f == 0:
                    failed += 1
                    print(f"FAILED: {t['name']} ({result}) after its cases passed, in {testlog}", file=sys.stderr)
            elif ok:
                passed += 1
            else:
                failed += 1
            if not ok:
                print(f"FAILED: {t['name']} ({result}) in {testlog}", file=sys.stderr)
                report_failure(t, xml)
    p, f, s = passed - before[0], failed - before[1], skipped - before[2]
    print(f"   {os.path.relpath(testlog)}: {p} passed, {f} failed, {s} skipped", file=sys.stderr)
line = f"{passed} passed, {failed} failed"
if skipped:
    line += f", {skipped} skipped"
print(line)
sys.exit(1 if failed or passed == 0 else 0)
