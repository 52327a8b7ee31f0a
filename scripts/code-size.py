#!/usr/bin/env python3
"""Source files over a line budget, and functions outside tests over a length budget.

    scripts/code-size.py [--file-lines 600] [--fn-lines 80] DIR_OR_FILE...

A function runs from its `fn` line to the closing brace at the same indentation. Prints each
one over budget; exits 1 when any is.
"""

import argparse
import re
import sys
from pathlib import Path

FN = re.compile(r"^(\s*)(pub(\([^)]*\))? )?(const )?(async )?(unsafe )?fn (\w+)")


def functions(lines):
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m or line.rstrip().endswith(";"):
            continue
        indent = m.group(1)
        for j in range(i, len(lines)):
            if lines[j] == indent + "}" or (j == i and line.rstrip().endswith("}")):
                yield m.group(7), i + 1, j - i + 1
                break


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file-lines", type=int, default=600)
    ap.add_argument("--fn-lines", type=int, default=80, help="0 checks file sizes only")
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    bad = 0
    for d in a.dirs:
        root = Path(d)
        for f in [root] if root.is_file() else sorted(root.rglob("*.rs")):
            lines = f.read_text().split("\n")
            if len(lines) > a.file_lines:
                print(f"{f}: {len(lines)} lines")
                bad += 1
            if a.fn_lines == 0 or f.name == "tests.rs" or "tests" in f.parts:
                continue
            for name, at, n in functions(lines):
                if n > a.fn_lines:
                    print(f"{f}:{at}: fn {name} is {n} lines")
                    bad += 1
    if not bad:
        fns = f", no function over {a.fn_lines} lines" if a.fn_lines else ""
        print(f"no file over {a.file_lines} lines{fns}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
