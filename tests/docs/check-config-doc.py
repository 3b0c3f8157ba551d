#!/usr/bin/env python3
"""docs/operating/configuration.md against the flag registry, as metrics.md is checked against the metrics:
every long flag of every subcommand (what `chargeguard SUBCOMMAND --help` lists, the binary's own registry) has
a row in a table of configuration.md (first column `--flag`), and every row names a flag some subcommand has.
`--help` and `--version` need no row; nor do a subcommand's positional arguments.
usage: check-config-doc.py SOURCE_ROOT CHARGEGUARD_EXE"""
import re
import subprocess
import sys

root, exe = sys.argv[1], sys.argv[2]


def help_of(*args):
    return subprocess.run([exe, *args, "--help"], capture_output=True, text=True, check=True).stdout


top = help_of()
subs = re.findall(r"^  ([a-z][a-z-]+) {2,}", top.split("Subcommands:")[1].split("\n\n")[0], re.M)
flags = {}  # flag -> subcommands that take it
option_line = re.compile(r"^\s+(?:-\w,)?(--[a-z0-9][a-z0-9-]*)", re.M)


def collect(path, text):
    for f in option_line.findall(text):
        if f not in ("--help", "--version", "--help-all"):
            flags.setdefault(f, set()).add(" ".join(path) or "(global)")


collect([], top.split("Subcommands:")[0])
for s in subs:
    text = help_of(s)
    collect([s], text)
    if "Subcommands:" in text:
        for sub in re.findall(r"^  ([a-z][a-z-]+) {2,}", text.split("Subcommands:")[1], re.M):
            collect([s, sub], help_of(s, sub))

doc = open(f"{root}/docs/operating/configuration.md").read()
# A flag's row: the first cell of a table row names it (`--a`, `--b` / `--c` …), or, for the one-shot
# subcommands, the second cell of the row whose first cell names the subcommand (`vault list` / `show ID`).
rows, per_command = set(), []
for line in doc.splitlines():
    if not line.startswith("|") or line.startswith("|---"):
        continue
    cells = [c.strip() for c in line.replace("\\|", "/").strip("|").split("|")]
    if re.match(r"`[a-z]", cells[0]):
        words = re.findall(r"(?<![-\w])([a-z][a-z-]+)", cells[0])
        per_command.append((words, set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", " ".join(cells)))))
    else:
        rows |= set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", cells[0]))


def documented(flag, commands):
    if flag in rows:
        return True
    for cmd in commands:
        path = cmd.split()
        for words, fl in per_command:
            if flag in fl and words[0] == path[0] and (len(path) == 1 or path[1] in words):
                return True
    return False


fail = []
for f in sorted(flags):
    missing = sorted(c for c in flags[f] if not documented(f, [c]))
    if missing:
        fail.append(f"{f} ({', '.join(missing)}) is not in configuration.md")
every = set(rows) | {f for _, fl in per_command for f in fl}
for f in sorted(every - set(flags)):
    fail.append(f"configuration.md documents {f}, which no subcommand takes")
# Every subcommand has its row in design.md §1's table and in README's.
design = open(f"{root}/docs/design.md").read().split("## 1. What runs")[1].split("\n## ")[0]
readme = open(f"{root}/README.md").read().split("## Subcommands")[1].split("\n## ")[0]
for s in subs:
    if not re.search(r"^\| `" + re.escape(s) + r"\b", design, re.M):
        fail.append(f"design.md §1 has no row for the subcommand {s}")
    if not re.search(r"^\| `chargeguard " + re.escape(s) + r"\b", readme, re.M):
        fail.append(f"README.md's subcommand table has no row for {s}")
for f in fail:
    print("FAIL:", f)
if fail:
    sys.exit(1)
print(f"ok: {len(flags)} flags of {len(subs)} subcommands, each with its row in configuration.md")
