#!/usr/bin/env python3
"""Checks the documentation against the code it describes.

For README.md and every Markdown file under docs/:

* commands: every `kvslim ...`, `target/release/kvslim ...` and
  `cargo run --release [-p kvslim] -- ...` line in a ```sh block must parse:
  its subcommand exists (`kvslim SUBCOMMAND --help` succeeds; nested ones
  such as `eval merge` too) and every `--flag` / `-x` it uses is an option
  that subcommand's `--help` lists;
* links: every relative link `[text](path)` or image `![alt](path)` must
  point to an existing file or folder, and a `#fragment` must name a heading
  of the target Markdown file (GitHub's anchors);
* generated tables: a `<!-- generated: python3 scripts/... -->` marker says
  the tables after it are that command's output; every table line the
  command prints must appear in the file;
* auto's table: crates/cache/src/policy/auto_table.json is what
  `python3 scripts/auto_table.py` makes of the committed results (when the
  checked tree has one);
* the front page: README.md has at most README_MAX_LINES (250) lines
  (results belong in docs/results/, details in the guides; issue #48), and
  every link of README.md, to docs/*.md pages included, resolves (the link
  check above; `--pending` is the only exception, and none is the default).

Prints one line per problem (FILE:LINE: ...) and ends with `N passed, M
failed`; exits 1 when anything failed. Needs the built binary
(`cargo build --release`); run from anywhere:

    python3 scripts/check_docs.py [--root DIR] [--binary PATH]

Standard library only.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]

# what a line of a shell block may start with before the command itself
PREFIX_WORDS = {"do", "then", "else", "time", "exec", "!", "{", "("}
KVSLIM_NAMES = {"kvslim", "target/release/kvslim", "./target/release/kvslim"}
GENERATED = re.compile(r"<!--\s*generated:\s*(.+?)\s*-->")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
# the front page's length limit (issue #48): results go to docs/results/
README_MAX_LINES = 250


@dataclass
class Report:
    passed: int = 0
    problems: List[str] = field(default_factory=list)
    kinds: Dict[str, int] = field(default_factory=dict)

    def ok(self, kind: str = "other") -> None:
        self.passed += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def fail(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")


# ---------------------------------------------------------------- files


def markdown_files(root: Path) -> List[Path]:
    files = [root / "README.md"] if (root / "README.md").exists() else []
    docs = root / "docs"
    if docs.is_dir():
        files += sorted(p for p in docs.rglob("*.md") if p.is_file())
    return files


def rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------- shell blocks


def sh_blocks(text: str) -> Iterator[Tuple[int, List[str]]]:
    """(first line number, lines) of every ```sh / ```bash / ```shell block."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        body: List[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence[:3]):
            body.append(lines[j])
            j += 1
        if lang in ("sh", "bash", "shell", "console"):
            yield i + 2, body
        i = j + 1


def strip_comment(line: str) -> str:
    """The line without a shell comment (`#` at the start of a word, outside quotes)."""
    quote: Optional[str] = None
    prev = " "
    for k, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
            elif ch == "\\" and quote == '"':
                pass
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev in " \t;|&(":
            return line[:k]
        prev = ch
    return line


def logical_lines(body: Sequence[str], first: int) -> Iterator[Tuple[int, str]]:
    """Joins backslash continuations; yields (line number, text without comments)."""
    buf, start = "", first
    for k, raw in enumerate(body):
        if not buf:
            start = first + k
        line = strip_comment(raw).rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            yield start, buf
        buf = ""
    if buf.strip():
        yield start, buf


def commands(line: str) -> Iterator[List[str]]:
    """The simple commands of a shell line, as word lists (split at ; | & && ||)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        tokens = list(lex)
    except ValueError:  # unbalanced quotes: leave it to the reader
        return
    words: List[str] = []
    for tok in tokens:
        if tok and all(c in ";&|()" for c in tok):
            if words:
                yield words
            words = []
        else:
            words.append(tok)
    if words:
        yield words


def kvslim_args(words: List[str]) -> Optional[List[str]]:
    """The arguments after the binary when `words` runs the kvslim CLI, else None."""
    i = 0
    while i < len(words) and (words[i] in PREFIX_WORDS or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i])):
        i += 1
    if i == len(words):
        return None
    if words[i] in KVSLIM_NAMES:
        return words[i + 1 :]
    if words[i] == "cargo" and i + 1 < len(words) and words[i + 1] == "run":
        rest = words[i + 2 :]
        if "--" not in rest:
            return None
        opts, args = rest[: rest.index("--")], rest[rest.index("--") + 1 :]
        if "--example" in opts or ("--bin" in opts and "kvslim" not in opts):
            return None
        for flag in ("-p", "--package"):
            if flag in opts and opts[opts.index(flag) + 1 : opts.index(flag) + 2] != ["kvslim"]:
                return None
        return args
    return None


# ---------------------------------------------------------------- the CLI's help


@dataclass
class Help:
    options: set
    commands: set


OPTION = re.compile(r"^(?:  -([A-Za-z0-9]), |      )--([A-Za-z0-9][\w-]*)")
COMMAND = re.compile(r"^  ([a-z][\w-]*)\s")


@functools.lru_cache(maxsize=None)
def cli_help(binary: str, path: Tuple[str, ...]) -> Optional[Help]:
    """The options and subcommands `binary PATH... --help` lists; None if it fails."""
    try:
        out = subprocess.run(
            [binary, *path, "--help"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    options, cmds = set(), set()
    in_commands = False
    for line in out.stdout.split("\n"):
        if line.startswith("Commands:"):
            in_commands = True
            continue
        if in_commands:
            m = COMMAND.match(line)
            if m:
                cmds.add(m.group(1))
                continue
            if line and not line.startswith(" "):
                in_commands = False
        m = OPTION.match(line)
        if m:
            options.add("--" + m.group(2))
            if m.group(1):
                options.add("-" + m.group(1))
    return Help(options, cmds - {"help"})


def check_command(args: List[str], binary: str, where: str, report: Report) -> None:
    shown = " ".join(["kvslim", *args])
    if len(shown) > 90:
        shown = shown[:87] + "..."
    top = cli_help(binary, ())
    if top is None:
        report.fail(where, f"`{binary} --help` failed")
        return
    if not args or args[0].startswith("-"):
        bad = [a for a in args if a.startswith("-") and a.split("=")[0] not in top.options]
        if bad:
            report.fail(where, f"`{shown}`: unknown option {bad[0]}")
        else:
            report.ok("command")
        return
    path: List[str] = [args[0]]
    if args[0] not in top.commands:
        report.fail(where, f"`{shown}`: no subcommand `{args[0]}` (known: {', '.join(sorted(top.commands))})")
        return
    rest = args[1:]
    sub = cli_help(binary, tuple(path))
    while sub is not None and sub.commands and rest and rest[0] in sub.commands:
        path.append(rest[0])
        rest = rest[1:]
        sub = cli_help(binary, tuple(path))
    if sub is None:
        report.fail(where, f"`{shown}`: `kvslim {' '.join(path)} --help` failed")
        return
    for a in rest:
        if a == "--":
            break
        if a.startswith("--"):
            flag = a.split("=", 1)[0]
        elif re.fullmatch(r"-[A-Za-z]", a):
            flag = a
        else:
            continue
        if flag not in sub.options:
            report.fail(where, f"`{shown}`: `kvslim {' '.join(path)}` has no option {flag}")
            return
    report.ok("command")


def check_commands(path: Path, text: str, root: Path, binary: str, report: Report) -> None:
    for first, body in sh_blocks(text):
        for number, line in logical_lines(body, first):
            for words in commands(line):
                args = kvslim_args(words)
                if args is not None:
                    check_command(args, binary, f"{rel(path, root)}:{number}", report)


# ---------------------------------------------------------------- links


def without_code(text: str) -> List[str]:
    """The file's lines with fenced blocks blanked and inline code removed."""
    out: List[str] = []
    fence: Optional[str] = None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
            continue
        if m:
            fence = m.group(1)[:3]
            out.append("")
            continue
        out.append(re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"`", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset:
    seen: Dict[str, int] = {}
    out = set()
    fence: Optional[str] = None
    for line in path.read_text(encoding="utf-8").split("\n"):
        m = FENCE.match(line)
        if fence:
            if line.strip().startswith(fence):
                fence = None
            continue
        if m:
            fence = m.group(1)[:3]
            continue
        h = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not h:
            continue
        base = slug(h.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def check_links(path: Path, text: str, root: Path, report: Report, pending: Sequence[str]) -> None:
    for number, line in enumerate(without_code(text), start=1):
        for m in LINK.finditer(line):
            target = m.group(1)
            where = f"{rel(path, root)}:{number}"
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:, …
                continue
            file_part, _, fragment = target.partition("#")
            dest = path if not file_part else (path.parent / file_part).resolve()
            if not dest.exists():
                if rel(dest, root.resolve()) in pending:
                    print(f"note: {where}: {target} is not written yet (pending)")
                    report.ok("link")
                else:
                    report.fail(where, f"link to {target}: no such file")
                continue
            if fragment and dest.suffix == ".md" and dest.is_file():
                if fragment not in anchors(dest):
                    report.fail(where, f"link to {target}: no heading with anchor #{fragment} in {rel(dest, root.resolve())}")
                    continue
            report.ok("link")


# ---------------------------------------------------------------- generated tables


def check_generated(path: Path, text: str, root: Path, report: Report) -> None:
    lines = set(text.split("\n"))
    for number, line in enumerate(without_code(text), start=1):
        m = GENERATED.search(line)
        if not m:
            continue
        where = f"{rel(path, root)}:{number}"
        cmd = m.group(1)
        words = shlex.split(cmd)
        if len(words) < 2 or words[0] not in ("python3", "python") or not words[1].startswith("scripts/"):
            report.fail(where, f"generated: only `python3 scripts/...` commands are run, not `{cmd}`")
            continue
        try:
            out = subprocess.run(
                [sys.executable, *words[1:]], cwd=root, capture_output=True, text=True, timeout=120, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            report.fail(where, f"generated: `{cmd}` did not run ({e})")
            continue
        if out.returncode != 0:
            report.fail(where, f"generated: `{cmd}` exited {out.returncode}: {out.stderr.strip()[-200:]}")
            continue
        table = [l for l in out.stdout.split("\n") if l.startswith("|")]
        missing = [l for l in table if l not in lines]
        if not table:
            report.fail(where, f"generated: `{cmd}` printed no table")
        elif missing:
            report.fail(where, f"generated: {len(missing)} of {len(table)} table lines of `{cmd}` are not in the file, e.g. {missing[0][:80]}")
        else:
            report.ok("generated table")


# ---------------------------------------------------------------- auto's table


def check_auto_table(root: Path, report: Report) -> None:
    """Fails when auto's generated table differs from what the results give."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import auto_table  # noqa: E402  (scripts/auto_table.py)

    if not (root / auto_table.TABLE).exists():
        return
    try:
        problem = auto_table.check(root)
    except (OSError, ValueError, KeyError) as e:
        problem = f"`{auto_table.COMMAND}` could not read the results: {e}"
    if problem:
        report.fail(auto_table.TABLE, problem)
    else:
        report.ok("generated table")


# ---------------------------------------------------------------- the front page


def check_readme_length(root: Path, report: Report) -> Optional[int]:
    """Fails when README.md is longer than README_MAX_LINES; its line count.

    A README within the limit adds no "passed" count (the totals stay those
    of commands, links and tables); main prints its length instead."""
    path = root / "README.md"
    if not path.is_file():
        return None
    n = len(path.read_text(encoding="utf-8").splitlines())
    if n > README_MAX_LINES:
        report.fail(
            f"README.md:{README_MAX_LINES + 1}",
            f"README.md has {n} lines, over the front page's limit of {README_MAX_LINES}: "
            "move results (tables with their commands) to docs/results/ and details to the "
            "guides under docs/, leaving a link (issue #48)",
        )
    return n


# ---------------------------------------------------------------- main


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository to check (default: this one)")
    ap.add_argument("--binary", help="the kvslim binary (default: ROOT/target/release/kvslim)")
    ap.add_argument(
        "--pending",
        action="append",
        default=[],
        help="a linked file that may not exist yet (reported, not failed); none by default, "
        "so every docs/*.md page README.md links must exist",
    )
    a = ap.parse_args(argv)
    root = a.root.resolve()
    binary = a.binary or str(ROOT / "target" / "release" / "kvslim")
    report = Report()
    have_binary = os.access(binary, os.X_OK)
    if not have_binary:
        report.fail(binary, "not found or not executable: build it with `cargo build --release` (commands not checked)")
    for path in markdown_files(root):
        text = path.read_text(encoding="utf-8")
        if have_binary:
            check_commands(path, text, root, binary, report)
        check_links(path, text, root, report, a.pending)
        check_generated(path, text, root, report)
    check_auto_table(root, report)
    readme_lines = check_readme_length(root, report)
    for p in report.problems:
        print(p)
    kinds = ", ".join(f"{n} {k}s" for k, n in sorted(report.kinds.items()))
    front = "" if readme_lines is None else f" (README.md: {readme_lines} of {README_MAX_LINES} lines)"
    print(f"checked {len(markdown_files(root))} files{front}: {kinds or 'nothing'} passed")
    print(f"{report.passed} passed, {len(report.problems)} failed")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
