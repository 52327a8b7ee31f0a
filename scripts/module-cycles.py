#!/usr/bin/env python3
"""Import circles between sibling modules of each crate, and source files over a line budget.

For every module scope (a crate root or a module with children) the direct child modules are
nodes; child A points to child B when any file under A names a path under B (`crate::b::…`,
`super::b::…`, or `use` groups of those). A parent and its own children are not compared: a
parent re-exporting its children and a child using its parent is the normal shape of a module.
Test files (`tests.rs`, `tests/`) and inline `mod tests { … }` are left out. Exits 1 when any scope has a circle, printing it.

    scripts/module-cycles.py actors/src transfer/src engines/*/src src
"""

import re
import sys
from pathlib import Path

USE = re.compile(r"\b(crate|super)((?:::\w+)+|::\{)")


def module_path(root: Path, f: Path) -> tuple:
    rel = f.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def group_names(text: str, start: int) -> list:
    """The first names of each item of a `{…}` use group beginning at `start`."""
    depth, item, names = 0, "", []
    for ch in text[start:]:
        if ch == "{":
            depth += 1
            if depth == 1:
                continue
        if ch == "}":
            depth -= 1
            if depth == 0:
                names.append(item)
                break
        if ch == "," and depth == 1:
            names.append(item)
            item = ""
            continue
        if depth >= 1:
            item += ch
    out = []
    for n in names:
        m = re.match(r"\s*(\w+)", n)
        if m and m.group(1) != "self":
            out.append(m.group(1))
    return out


def references(text: str, here: tuple) -> set:
    """Absolute module paths (tuples of names) that a file refers to."""
    text = re.sub(r"//[^\n]*", "", text)
    # An inline test module (by convention the file's last item) is a test file.
    text = re.split(r"#\[cfg\(test\)\]\s*mod tests \{", text)[0]
    refs = set()
    for m in USE.finditer(text):
        base = () if m.group(1) == "crate" else here[:-1]
        if m.group(2) == "::{":
            for name in group_names(text, m.end() - 1):
                refs.add(base + (name,))
        else:
            names = [p for p in m.group(2).split("::") if p]
            if names and names[0] == "super":
                continue
            refs.add(base + tuple(names))
    return refs


def cycles(graph: dict) -> list:
    found, state, stack = [], {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return found


def check(root: Path) -> int:
    files = [f for f in root.rglob("*.rs") if f.name != "tests.rs" and "tests" not in f.relative_to(root).parts]
    mods = {module_path(root, f): f for f in files}
    refs = {m: references(f.read_text(), m if f.name in ("mod.rs", "lib.rs", "main.rs") else m) for m, f in mods.items()}
    bad = 0
    scopes = {m[:-1] for m in mods if m} | {()}
    for scope in sorted(scopes):
        children = {m[len(scope)] for m in mods if len(m) > len(scope) and m[: len(scope)] == scope}
        graph = {c: set() for c in children}
        for m, targets in refs.items():
            if len(m) <= len(scope) or m[: len(scope)] != scope:
                continue
            a = m[len(scope)]
            for t in targets:
                if len(t) > len(scope) and t[: len(scope)] == scope and t[len(scope)] in children:
                    b = t[len(scope)]
                    if b != a:
                        graph[a].add(b)
        for c in cycles(graph):
            name = "::".join(scope) or "crate"
            print(f"{root}: circle in {name}: {' -> '.join(c)}")
            bad += 1
    return bad


def main() -> int:
    roots = [Path(a) for a in sys.argv[1:]] or [Path("src")]
    bad = sum(check(r) for r in roots)
    if not bad:
        print(f"no import circle in {len(roots)} crates")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
