#!/usr/bin/env python3
"""Checks the documentation site in doc/site/ (one mdBook per language).

1. Every language has the same pages: its SUMMARY.md lists the same files, in the same order,
   as the English one, every listed file exists, and no page is left out of SUMMARY.md. Every
   page has the English page's fenced code blocks (comments in shell and TOML blocks aside)
   and the same explicit heading ids (`{#id}`).
2. Every relative link resolves, and every `#anchor` names a heading of its target page, with
   ids made as mdBook makes them (explicit `{#id}`, else the heading's text, lowercased, spaces
   to `-`, other punctuation dropped, repeats numbered).
3. Every repository path the pages cite (`examples/embedded.rs`, `doc/bench/…`) and every
   `{{#include}}` exists.
4. If `mdbook` is on PATH (or named by $MDBOOK), every book is built into a temporary folder
   (or `--out DIR`, with the language index at its root); an error or warning fails the check,
   and the heading ids of the built pages are compared with those computed here.

Exits 1 with one `file:line: message` per problem. Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import html.parser
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "doc" / "site"
LANGS = ["en", "zh-CN", "zh-TW", "ja", "ko", "de", "fr", "es", "pt-BR", "ru"]
BASE = "en"
INDEX = "index.html"  # the language index, at the site's root

# Top-level folders of the repository whose paths the pages may cite.
REPO_DIRS = (
    "examples|doc|scripts|src|tests|python|engines|transfer|i18n|actors|benches|test-util|shared"
)
REPO_PATH = re.compile(r"(?<![\w.~/$<>-])(?:" + REPO_DIRS + r")/[\w./-]*")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
ATTRS = re.compile(r"\s*\{([^{}]*)\}\s*$")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
AUTOLINK = re.compile(r"<(https?://[^>\s]+)>")
INCLUDE = re.compile(r"\{\{#(?:include|rustdoc_include)\s+([^}\s:]+)[^}]*\}\}")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


class Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: Path, line: int, message: str) -> None:
        self.items.append(f"{shown(path)}:{line}: {message}")


def shown(path: Path) -> Path:
    """A path as messages show it: relative to the repository where it lies inside it."""
    try:
        return path.relative_to(ROOT)
    except ValueError:
        return path


class Page:
    """A Markdown page: its lines, which lines are code, its headings and their ids."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = path.read_text(encoding="utf-8").split("\n")
        self.code = [False] * len(self.lines)
        self.blocks: list[tuple[int, str, list[str]]] = []  # (line, info, body)
        self.ids: dict[str, int] = {}  # id -> line
        self.explicit: dict[str, int] = {}
        self._scan()

    def _scan(self) -> None:
        fence = None
        used: set[str] = set()
        for i, line in enumerate(self.lines):
            m = FENCE.match(line)
            if fence is None and m and len(m.group(1)) < 4:
                fence = (m.group(2)[0], len(m.group(2)))
                self.code[i] = True
                self.blocks.append((i + 1, m.group(3).strip(), []))
                continue
            if fence is not None:
                self.code[i] = True
                close = m and m.group(2)[0] == fence[0] and len(m.group(2)) >= fence[1] and not m.group(3).strip()
                if close:
                    fence = None
                else:
                    self.blocks[-1][2].append(line)
                continue
            h = HEADING.match(line)
            if not h:
                continue
            text = h.group(2)
            explicit = None
            a = ATTRS.search(text)
            if a:
                text = text[: a.start()]
                for attr in a.group(1).split():
                    if attr.startswith("#"):
                        explicit = attr[1:]
            if explicit:
                hid = explicit
                self.explicit[hid] = i + 1
                used.add(hid)
            else:
                hid = unique_id(id_from_content(plain_text(text)), used)
            self.ids.setdefault(hid, i + 1)

    def prose(self):
        """(line number, text) of each line outside fenced code blocks."""
        for i, line in enumerate(self.lines):
            if not self.code[i]:
                yield i + 1, line


def plain_text(md: str) -> str:
    """The text of inline Markdown, as it ends up in the HTML heading."""
    out = []
    parts = re.split(r"(`+)", md)
    in_code = None
    for part in parts:
        if part and set(part) == {"`"}:
            if in_code is None:
                in_code = part
                continue
            if part == in_code:
                in_code = None
                continue
        if in_code is not None:
            out.append(part)
            continue
        part = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", part)
        part = re.sub(r"<[^>]+>", "", part)
        part = re.sub(r"(\*{1,3}|_{2,3})", "", part)
        part = part.replace("\\", "")
        part = part.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
        out.append(part)
    return "".join(out)


def id_from_content(text: str) -> str:
    """mdBook's heading id: lowercase; letters, digits, `_` and `-` kept; spaces to `-`."""
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "_-":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def unique_id(hid: str, used: set[str]) -> str:
    if hid not in used:
        used.add(hid)
        return hid
    n = 1
    while f"{hid}-{n}" in used:
        n += 1
    used.add(f"{hid}-{n}")
    return f"{hid}-{n}"


def strip_code_spans(line: str) -> str:
    """The line with inline code spans replaced by spaces (links inside them are not links)."""
    return re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line)


def summary_files(path: Path, problems: Problems) -> list[tuple[str, int]]:
    files = []
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        for m in re.finditer(r"\]\(([^)]*)\)", line):
            target = m.group(1).strip()
            if not target:
                continue  # a draft chapter
            if not target.endswith(".md"):
                problems.add(path, n, f"SUMMARY.md entry `{target}` is not a .md file")
            files.append((target, n))
    return files


def normalize_code(info: str, body: list[str]) -> list[str]:
    """A code block as compared across languages: comments of shell and TOML blocks removed."""
    lang = info.split(",")[0].strip()
    if lang not in ("sh", "bash", "shell", "toml"):
        return body
    out = []
    for line in body:
        line = re.sub(r"(^|\s)#(?!\{).*$", "", line).rstrip()
        if line:
            out.append(line)
    return out


def output_name(rel: str) -> str:
    """The HTML file mdBook writes for a source page (relative to the book's src)."""
    stem = rel[:-3]
    if Path(stem).name.lower() == "readme":
        stem = str(Path(stem).with_name("index"))
    return stem + ".html"


def check(site: Path, problems: Problems) -> dict:
    langs = [d.name for d in sorted(site.iterdir()) if (d / "book.toml").is_file()]
    for lang in LANGS:
        if lang not in langs:
            problems.add(site, 0, f"language `{lang}` has no book (expected {site / lang / 'book.toml'})")
    for lang in langs:
        if lang not in LANGS:
            problems.add(site / lang / "book.toml", 0, f"unexpected language `{lang}` (known: {', '.join(LANGS)})")
    langs = [lang for lang in LANGS if lang in langs]
    if BASE not in langs:
        return {"langs": langs, "pages": {}}

    # 1. Same pages everywhere.
    base_summary = summary_files(site / BASE / "src" / "SUMMARY.md", problems)
    base_files = [f for f, _ in base_summary]
    pages: dict[str, dict[str, Page]] = {}
    for lang in langs:
        book = site / lang
        toml = (book / "book.toml").read_text(encoding="utf-8")
        m = re.search(r'^\s*language\s*=\s*"([^"]*)"', toml, re.M)
        if not m or m.group(1) != lang:
            problems.add(book / "book.toml", 1, f'book.language must be "{lang}"')
        if not re.search(r"^\s*create-missing\s*=\s*false", toml, re.M):
            problems.add(book / "book.toml", 1, "[build] create-missing = false is required (a missing page must fail)")
        src = book / "src"
        summary_path = src / "SUMMARY.md"
        if not summary_path.is_file():
            problems.add(summary_path, 0, "missing SUMMARY.md")
            continue
        listed = summary_files(summary_path, problems)
        names = [f for f, _ in listed]
        for k, (name, line) in enumerate(listed):
            if k >= len(base_files) or base_files[k] != name:
                want = base_files[k] if k < len(base_files) else "nothing"
                problems.add(summary_path, line, f"lists `{name}` where the English SUMMARY.md lists {want}")
        for name in base_files[len(names):]:
            problems.add(summary_path, len(summary_path.read_text(encoding='utf-8').split(chr(10))),
                         f"does not list `{name}`, which the English SUMMARY.md lists")
        pages[lang] = {}
        for name, line in listed:
            path = src / name
            if not path.is_file():
                problems.add(summary_path, line, f"lists `{name}`, which does not exist")
                continue
            pages[lang][name] = Page(path)
        for path in sorted(src.rglob("*.md")):
            rel = path.relative_to(src).as_posix()
            if rel != "SUMMARY.md" and rel not in names:
                problems.add(path, 1, "page is not listed in SUMMARY.md")

    # Code blocks and explicit ids as in English.
    for lang in langs:
        if lang == BASE or lang not in pages:
            continue
        for name, page in pages[lang].items():
            base = pages[BASE].get(name)
            if base is None:
                continue
            if len(page.blocks) != len(base.blocks):
                problems.add(page.path, 1, f"has {len(page.blocks)} code blocks, the English page {len(base.blocks)}")
            for (line, info, body), (bline, binfo, bbody) in zip(page.blocks, base.blocks):
                if info != binfo:
                    problems.add(page.path, line, f"code block is `{info}`, the English one (line {bline}) `{binfo}`")
                elif normalize_code(info, body) != normalize_code(binfo, bbody):
                    problems.add(page.path, line, f"code block differs from the English one (line {bline}) beyond comments")
            for hid, bline in base.explicit.items():
                if hid not in page.explicit:
                    problems.add(page.path, 1, f"no heading with id `{{#{hid}}}` (English line {bline})")
            for hid, line in page.explicit.items():
                if hid not in base.explicit:
                    problems.add(page.path, line, f"heading id `{{#{hid}}}` is not in the English page")

    # 2. Links and anchors. Outputs: "<lang>/<page>.html" and the language index.
    outputs: dict[str, Page | None] = {INDEX: None}
    for lang, ps in pages.items():
        for name, page in ps.items():
            outputs[f"{lang}/{output_name(name)}"] = page
        if "index.md" in ps or "README.md" in ps:
            outputs.setdefault(f"{lang}/index.html", ps.get("index.md") or ps.get("README.md"))
    counts = {"links": 0, "anchors": 0, "paths": 0}

    def resolve(origin: Path, line: int, out_dir: str, src_dir: Path | None, target: str, own: Page | None) -> None:
        counts["links"] += 1
        path, _, anchor = target.partition("#")
        if not path:
            dest = own
            if dest is None:
                problems.add(origin, line, f"anchor link `{target}` on a page without headings")
                return
        elif path.endswith(".md") and src_dir is not None:
            file = (src_dir / path).resolve()
            dest = None
            for ps in pages.values():
                for page in ps.values():
                    if page.path.resolve() == file:
                        dest = page
            if dest is None:
                problems.add(origin, line, f"link `{target}`: {path} is not a page of the site")
                return
        else:
            joined = os.path.normpath(os.path.join(out_dir, path)).replace(os.sep, "/")
            if path.endswith("/"):
                joined += "/index.html"
            if joined.startswith("..") or joined not in outputs:
                problems.add(origin, line, f"link `{target}` leads to `{joined}`, which the site does not have")
                return
            dest = outputs[joined]
        if anchor:
            counts["anchors"] += 1
            if dest is None or anchor not in dest.ids:
                where = shown(dest.path) if dest is not None else "the language index"
                problems.add(origin, line, f"link `{target}`: no heading with id `{anchor}` in {where}")

    for lang, ps in pages.items():
        src = site / lang / "src"
        for name, page in ps.items():
            out_dir = os.path.dirname(f"{lang}/{output_name(name)}")
            for n, line in page.prose():
                text = strip_code_spans(line)
                for m in LINK.finditer(text):
                    target = m.group(2)
                    if not target or SCHEME.match(target):
                        continue
                    resolve(page.path, n, out_dir, page.path.parent, target, page)
            # 3. Cited repository paths, and includes.
            for n, line in enumerate(page.lines, 1):
                for m in INCLUDE.finditer(line):
                    counts["paths"] += 1
                    if not (page.path.parent / m.group(1)).is_file():
                        problems.add(page.path, n, f"{{{{#include {m.group(1)}}}}}: no such file")
                scrubbed = INCLUDE.sub(" ", line)
                scrubbed = re.sub(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+", " ", scrubbed)
                for m in REPO_PATH.finditer(scrubbed):
                    cited = m.group(0).rstrip(".,;:")
                    rest = scrubbed[m.end():m.end() + 1]
                    if rest in ("<", "*", "{"):
                        continue  # a placeholder such as gpu-<hash>
                    counts["paths"] += 1
                    if not (ROOT / cited).exists():
                        problems.add(page.path, n, f"cites `{cited}`, which is not in the repository")

    index = site / INDEX
    if not index.is_file():
        problems.add(index, 0, "missing language index page")
    else:
        for n, line in enumerate(index.read_text(encoding="utf-8").split("\n"), 1):
            for m in re.finditer(r'href="([^"]*)"', line):
                target = m.group(1)
                if SCHEME.match(target) or target.startswith("#"):
                    continue
                resolve(index, n, "", None, target, None)
        for lang in langs:
            if f'href="{lang}/' not in index.read_text(encoding="utf-8"):
                problems.add(index, 1, f"does not link the `{lang}` book")
    return {"langs": langs, "pages": pages, **counts}


class HeadingIds(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        if tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
            for k, v in attrs:
                if k == "id" and v:
                    self.ids.add(v)


def build(site: Path, mdbook: str, out: Path, found: dict, problems: Problems) -> str:
    version = subprocess.run([mdbook, "--version"], capture_output=True, text=True).stdout.strip()
    for lang in found["langs"]:
        dest = out / lang
        run = subprocess.run(
            [mdbook, "build", str(site / lang), "--dest-dir", str(dest)],
            capture_output=True,
            text=True,
            env={**os.environ, "NO_COLOR": "1", "MDBOOK_LOG": "warn"},
        )
        text = (run.stdout + run.stderr).strip()
        bad = [line for line in text.split("\n") if re.search(r"\b(ERROR|WARN)\b", line)]
        if run.returncode != 0 or bad:
            detail = "\n    ".join(text.split("\n")[-20:])
            problems.add(site / lang / "book.toml", 0, f"`mdbook build` failed (exit {run.returncode}):\n    {detail}")
            continue
        for name, page in found["pages"].get(lang, {}).items():
            built = dest / output_name(name)
            if not built.is_file():
                problems.add(page.path, 0, f"mdbook wrote no {shown(built)}")
                continue
            parser = HeadingIds()
            parser.feed(built.read_text(encoding="utf-8"))
            if parser.ids != set(page.ids):
                only_built = sorted(parser.ids - set(page.ids))
                only_here = sorted(set(page.ids) - parser.ids)
                problems.add(page.path, 0, f"heading ids differ from mdbook's: mdbook {only_built}, computed {only_here}")
    shutil.copy(site / INDEX, out / INDEX)
    return version


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=SITE, help="the site's sources (default doc/site)")
    parser.add_argument("--out", type=Path, help="build the site here and keep it (needs mdbook)")
    parser.add_argument("--no-build", action="store_true", help="skip the mdbook build")
    args = parser.parse_args()
    site = args.site.resolve()
    problems = Problems()
    found = check(site, problems)
    mdbook = os.environ.get("MDBOOK") or shutil.which("mdbook")
    built = "mdbook not found: books not built"
    if args.no_build:
        built = "build skipped"
    elif mdbook:
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            version = build(site, mdbook, args.out.resolve(), found, problems)
            built = f"{version} built {len(found['langs'])} books into {args.out}"
        else:
            with tempfile.TemporaryDirectory(prefix="xinf-docs-") as tmp:
                version = build(site, mdbook, Path(tmp), found, problems)
            built = f"{version} built {len(found['langs'])} books"
    elif args.out:
        problems.add(site, 0, "--out needs mdbook on PATH (or $MDBOOK)")
    if problems.items:
        for item in problems.items:
            print(item, file=sys.stderr)
        print(f"docs: {len(problems.items)} problem(s)", file=sys.stderr)
        return 1
    n_pages = len(next(iter(found["pages"].values()), {}))
    print(
        f"docs: {len(found['langs'])} languages × {n_pages} pages; {found.get('links', 0)} links, "
        f"{found.get('anchors', 0)} anchors, {found.get('paths', 0)} repository paths checked; {built}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
