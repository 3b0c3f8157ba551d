#!/usr/bin/env python3
"""Every relative link in README.md and docs/ resolves: the file exists and, for `file.md#anchor` (or
`#anchor`), a heading of that file has the anchor (GitHub's rule: lower case, punctuation dropped, spaces to
hyphens). Prose pointers of the form "README: section" are not links and are refused too, so a renamed
section cannot leave one behind.
usage: check-links.py SOURCE_ROOT"""
import os
import re
import sys

root = sys.argv[1]


def slug(heading):
    s = re.sub(r"[`*_]", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        text = open(path).read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        cache[path] = {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
    return cache[path]


docs = [os.path.join(root, "README.md")]
for d, _, files in os.walk(os.path.join(root, "docs")):
    docs += [os.path.join(d, f) for f in files if f.endswith(".md")]
extra = [os.path.join(root, p) for p in ("deploy/prometheus/alerts.yml", "deploy/kubernetes/chargeguard.yaml",
                                          "Dockerfile")]
fail, links = [], 0
for doc in sorted(docs):
    text = open(doc).read()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z]+:", target):
            continue  # http(s):, mailto:
        links += 1
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        rel = os.path.relpath(doc, root)
        if not os.path.exists(dest):
            fail.append(f"{rel}: link to {target}: no such file")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            fail.append(f"{rel}: link to {target}: {os.path.relpath(dest, root)} has no heading #{anchor}")
for f in sorted(docs) + extra:
    for m in re.finditer(r"README[:,] \"?([A-Za-z][\w -]*)", open(f).read()):
        fail.append(f"{os.path.relpath(f, root)}: 'README, {m.group(1)}' is not a link; link the section instead")
for f in fail:
    print("FAIL:", f)
if fail:
    sys.exit(1)
print(f"ok: {links} relative links in README.md and docs/ resolve")
