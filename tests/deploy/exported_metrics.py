"""The chargeguard_* metric names the source registers: every "chargeguard_…" string literal in src/'s C++ (and
its configured C++, *.cpp.in) that is a whole name (a literal ending in "_" is a prefix, not a metric). Shared
by the checks of the alerts, the dashboard and docs/operating/metrics.md."""
import os
import re


def exported(root):
    names = set()
    for d, _, files in os.walk(os.path.join(root, "src")):
        for f in files:
            if f.endswith((".cpp", ".hpp", ".cpp.in")):
                names |= set(re.findall(r'"(chargeguard_[a-z0-9_]*[a-z0-9])"', open(os.path.join(d, f)).read()))
    return names
