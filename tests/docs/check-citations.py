#!/usr/bin/env python3
"""Code comments cite the docs by section: `design.md §N` (or `DESIGN.md §N`) and `docs/contributing.md
"Section"`. Each cited section must exist, so a renumbered or renamed section cannot leave comments pointing
nowhere (docs/contributing.md says how comments cite).
usage: check-citations.py SOURCE_ROOT"""
import os
import re
import sys

root = sys.argv[1]
design = open(os.path.join(root, "docs/design.md")).read()
contributing = open(os.path.join(root, "docs/contributing.md")).read()
sections = set(re.findall(r"^## (\d+[a-z]?)\. ", design, re.M))
headings = {h.strip() for h in re.findall(r"^#+ (.+)$", contributing, re.M)}
fail, seen = [], 0
for d in ("src", "tests", "ci"):
    for dirpath, _, files in os.walk(os.path.join(root, d)):
        if "node_modules" in dirpath:
            continue
        for f in files:
            path = os.path.join(dirpath, f)
            try:
                text = open(path).read()
            except (UnicodeDecodeError, IsADirectoryError):
                continue
            rel = os.path.relpath(path, root)
            for n in re.findall(r"(?i)design\.md §(\d+[a-z]?)", text):
                seen += 1
                if n not in sections:
                    fail.append(f"{rel}: design.md §{n} does not exist")
            for h in re.findall(r'contributing\.md "([^"{}]+)"', text):
                h = re.sub(r"\s*(//|#)?\s*\n\s*(//|#)\s*", " ", h)  # a citation wrapped over comment lines
                seen += 1
                if h not in headings:
                    fail.append(f'{rel}: docs/contributing.md "{h}" is no section of it')
            if re.search(r"STYLE\.md", text) and not rel.startswith("tests/docs/"):
                fail.append(f"{rel}: cites STYLE.md, which is not part of the repository")
for f in fail:
    print("FAIL:", f)
if fail:
    sys.exit(1)
print(f"ok: {seen} citations of design.md and contributing.md name sections that exist")
