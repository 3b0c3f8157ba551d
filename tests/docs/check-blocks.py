#!/usr/bin/env python3
"""Every fenced block of README.md and docs/operating/*.md is accounted for: the line before it is a marker
  <!-- container-test: NAME -->  run as written by tests/container/run.sh (doc_run/doc_block NAME) or by the
                                 build-source.sh it runs (the documented image build),
  <!-- kube-test: NAME -->       read and applied by tests/deploy/kube-play-prep.mjs under podman kube play,
  <!-- ops-test: runbook -->     an incident's commands and outputs, each compared line by line with the real
                                 command's output by tests/integration/ops (runbook_mismatch);
  <!-- not-run: REASON -->       not runnable on a test machine, and why;
and every `chargeguard SUBCOMMAND …` command the docs show, in a block or in running text, names flags that
subcommand takes (`chargeguard SUBCOMMAND --help`, the binary's own registry), so a renamed or removed flag
cannot stay in a command someone will copy. Prints the inventory: each block, run or not and why.
usage: check-blocks.py SOURCE_ROOT CHARGEGUARD_EXE"""
import glob
import os
import re
import subprocess
import sys

root, exe = sys.argv[1], sys.argv[2]
runsh = "".join(open(os.path.join(root, "tests/container", f)).read() for f in ("run.sh", "build-source.sh"))
prep = open(os.path.join(root, "tests/deploy/kube-play-prep.mjs")).read()
ops_tests = "".join(open(f).read() for f in glob.glob(os.path.join(root, "tests/integration/ops/*.cpp")))
helps = {}


def help_of(path):
    if path not in helps:
        p = subprocess.run([exe, *path, "--help"], capture_output=True, text=True)
        helps[path] = p.stdout if p.returncode == 0 else None
    return helps[path]


def subcommands(text):
    return re.findall(r"^  ([a-z][a-z-]+) {2,}", text.split("Subcommands:")[1], re.M) if "Subcommands:" in text else []


top = help_of(())
global_flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", top.split("Subcommands:")[0]))


def check_command(cmd, where, fail):
    """cmd: the words after `chargeguard`. Flags must be the subcommand's."""
    words = [w for w in re.split(r"\s+", re.sub(r"[\[\]()]", " ", cmd)) if w]
    path, i = (), 0
    while i < len(words) and words[i].startswith("--") and words[i] in global_flags:
        i += 2 if words[i] == "--log-level" else 1
    if i < len(words) and words[i] in subcommands(top):
        path = (words[i],)
        i += 1
        sub = subcommands(help_of(path) or "")
        if i < len(words) and words[i] in sub:
            path += (words[i],)
            i += 1
    if not path:
        return 0  # prose ("chargeguard never …"), a container's name (`-c chargeguard`), or `--version`
    text = help_of(path)
    if text is None:
        fail.append(f"{where}: `chargeguard {' '.join(path)} --help` failed")
        return 0
    known = set(re.findall(r"^\s+(?:-\w,)?(--[a-z0-9][a-z0-9-]*)", text, re.M)) | global_flags
    for w in words[i:]:
        for f in re.findall(r"^(--[a-z0-9][a-z0-9-]*)", w.split("=")[0].rstrip(",;.…")):
            if f not in known:
                fail.append(f"{where}: `chargeguard {' '.join(path)}` has no flag {f}")
    return 1


docs = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs/operating/*.md")))
fail, inventory, commands = [], [], 0
for doc in docs:
    rel = os.path.relpath(doc, root)
    lines = open(doc).read().split("\n")
    i, prose = 0, []
    while i < len(lines):
        if not lines[i].startswith("```"):
            prose.append(lines[i])
            i += 1
            continue
        start, lang = i + 1, lines[i][3:].strip()
        j = start
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        body = lines[start:j]
        prev = next((l.strip() for l in reversed(lines[:i]) if l.strip()), "")
        where = f"{rel}:{start}"
        m = re.fullmatch(r"<!-- (container-test|kube-test): ([\w-]+) -->", prev)
        n = re.fullmatch(r"<!-- not-run: (.+?) -->", prev)
        o = re.fullmatch(r"<!-- ops-test: runbook -->", prev)
        if o:
            for cmd in (l for l in body if l.startswith("chargeguard ")):
                if cmd[:30] not in ops_tests:
                    fail.append(f"{where}: marked ops-test, but tests/integration/ops never compares '{cmd}'")
            inventory.append(f"run  {where} ({lang or 'text'}): ops-test runbook")
        elif m:
            kind, name = m.groups()
            if kind == "container-test" and not re.search(r"doc_(run|block|block_in)\b[^\n]*\b" + re.escape(name) + r"\b", runsh):
                fail.append(f"{where}: marked container-test {name}, which tests/container/run.sh (or build-source.sh) never runs")
            if kind == "kube-test" and f"kube-test: {name}" not in prep:
                fail.append(f"{where}: marked kube-test {name}, which tests/deploy/kube-play-prep.mjs never reads")
            inventory.append(f"run  {where} ({lang or 'text'}): {kind} {name}")
        elif n:
            inventory.append(f"skip {where} ({lang or 'text'}): {n.group(1)}")
        else:
            fail.append(f"{where}: a ``` block with neither a test marker nor <!-- not-run: REASON --> before it")
        if lang in ("sh", ""):
            text = "\n".join(body).replace("\\\n", " ")
            for line in text.split("\n"):
                line = line.split(" #")[0]
                for c in re.findall(r"(?:^|[\s;|&(])chargeguard\s+([^|;&#]*)", line):
                    commands += check_command(c, where, fail)
        i = j + 1
    for span in re.findall(r"`([^`\n]*\bchargeguard [^`\n]*)`", "\n".join(prose)):
        for c in re.findall(r"(?:^|[\s;|&(])chargeguard\s+([^|;&]*)", span):
            commands += check_command(c, f"{rel} (text)", fail)
for line in inventory:
    print(line)
for f in fail:
    print("FAIL:", f)
if fail:
    sys.exit(1)
run = sum(1 for l in inventory if l.startswith("run"))
print(f"ok: {len(inventory)} blocks ({run} run by tests, {len(inventory) - run} marked not-run with the reason); "
      f"{commands} chargeguard commands name flags their subcommand takes")
