#!/usr/bin/env python3
"""Code calibration text for `kvslim calibrate --kvzap --also-text`: the
top-level modules of this Python's standard library, minus every file the
LCC evaluation items come from ($KVSLIM_SHARED, else ../shared beside the
repository: data/code_completion), in name
order, each after a `# file: NAME` line.

    python3 scripts/kvzap_code_text.py OUT.txt

Deterministic for one Python version (the header of OUT.txt names it).
"""
import glob
import json
import os
import sys
import sysconfig

SHARED = os.environ.get("KVSLIM_SHARED", os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
LCC = os.path.join(SHARED, "data", "code_completion", "stdlib_lcc.jsonl")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(LCC) as items:
        held_out = {json.loads(line)["file"] for line in items}
    lib = sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in glob.glob(os.path.join(lib, "*.py")) if os.path.basename(f) not in held_out)
    with open(sys.argv[1], "w") as out:
        out.write(f"# Python {sys.version.split()[0]} standard library, {len(files)} modules"
                  f" ({len(held_out)} LCC files left out)\n")
        for f in files:
            out.write(f"# file: {os.path.basename(f)}\n")
            with open(f, encoding="utf-8", errors="replace") as src:
                out.write(src.read())
            out.write("\n")
    print(f"{len(files)} files -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
