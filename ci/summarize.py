#!/usr/bin/env python3
"""Sums meson testlog.json files into the one line CI reads: "N passed, N failed[, N skipped]".
Exit status 1 when anything failed (or nothing ran)."""
import json
import sys

passed = failed = skipped = 0
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)["result"]
            if r in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif r == "SKIP":
                skipped += 1
            else:
                failed += 1
                print(f"FAILED: {json.loads(line)['name']} ({r}) in {path}", file=sys.stderr)
line = f"{passed} passed, {failed} failed"
if skipped:
    line += f", {skipped} skipped"
print(line)
sys.exit(1 if failed or passed == 0 else 0)
