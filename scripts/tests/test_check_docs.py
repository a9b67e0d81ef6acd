"""Tests of scripts/check_docs.py: the repository's own docs pass, and broken
commands, links, anchors and generated tables in a small tree are reported."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_docs.py"
BINARY = ROOT / "target" / "release" / "kvslim"

spec = importlib.util.spec_from_file_location("check_docs", SCRIPT)
check_docs = importlib.util.module_from_spec(spec)
sys.modules["check_docs"] = check_docs  # dataclasses look their module up
spec.loader.exec_module(check_docs)

needs_binary = pytest.mark.skipif(
    not os.access(BINARY, os.X_OK),
    reason=f"{BINARY} is absent: build it with `cargo build --release` to check the docs' commands",
)


def run(*args):
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    return out.returncode, out.stdout.strip().split("\n")


@needs_binary
def test_the_repository_docs_pass():
    code, lines = run()
    assert re.fullmatch(r"\d+ passed, 0 failed", lines[-1]), "\n".join(lines)
    assert code == 0
    assert int(lines[-1].split()[0]) > 100, "commands and links were found and checked"


@needs_binary
def test_bad_commands_links_and_tables_are_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "table.py").write_text('print("| a | b |")\nprint("|---|---|")\nprint("| 1 | 2 |")\n')
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## There\n\n<!-- generated: python3 scripts/table.py -->\n\n| a | b |\n|---|---|\n| 1 | 3 |\n")
    (tmp_path / "README.md").write_text(
        "# T\n\n## Good heading\n\n```sh\n"
        "S=../shared\n"
        "kvslim generate --prompt hi --max-tokens 4   # fine\n"
        "kvslim generate --prompt hi --no-such-flag 3\n"
        "kvslim frobnicate\n"
        "for i in 0 1; do kvslim eval merge --out m --bogus a & done; wait\n"
        "cargo run --release -- perplexity \\\n    --text $S/x.txt --max-tokns 5\n"
        "echo hi | target/release/kvslim chat -m x\n"
        "```\n\n"
        "[ok](docs/a.md) [missing](docs/missing.md) [anchor](docs/a.md#there) "
        "[bad anchor](docs/a.md#nowhere) [self](#good-heading) `[in code](nope.md)`\n"
    )
    code, lines = run("--root", str(tmp_path), "--binary", str(BINARY))
    text = "\n".join(lines)
    assert code == 1
    assert "README.md:8: `kvslim generate --prompt hi --no-such-flag 3`: `kvslim generate` has no option --no-such-flag" in text
    assert "README.md:9: `kvslim frobnicate`: no subcommand `frobnicate`" in text
    assert "README.md:10: `kvslim eval merge --out m --bogus a`: `kvslim eval merge` has no option --bogus" in text
    assert "README.md:11:" in text and "has no option --max-tokns" in text
    assert "link to docs/missing.md: no such file" in text
    assert "no heading with anchor #nowhere in docs/a.md" in text
    assert "docs/a.md:5: generated: 1 of 3 table lines" in text
    assert "nope.md" not in text
    assert lines[-1] == "5 passed, 7 failed"  # 2 commands and 3 links pass


def test_a_missing_binary_fails_but_links_are_still_checked(tmp_path):
    (tmp_path / "README.md").write_text("# T\n\n[gone](gone.md)\n")
    code, lines = run("--root", str(tmp_path), "--binary", str(tmp_path / "no-kvslim"))
    assert code == 1
    assert any("not found or not executable" in line for line in lines)
    assert any("link to gone.md: no such file" in line for line in lines)
    assert lines[-1] == "0 passed, 2 failed"


def test_pending_links_are_noted_not_failed(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# T\n\n[later](docs/later.md)\n")
    code, lines = run("--root", str(tmp_path), "--binary", sys.executable, "--pending", "docs/later.md")
    assert any(line.startswith("note: README.md:3: docs/later.md is not written yet") for line in lines)
    assert lines[-1] == "1 passed, 0 failed" and code == 0


def test_github_anchors():
    assert check_docs.slug("2. CHAI (clustered head attention)") == "2-chai-clustered-head-attention"
    assert check_docs.slug("Tuning a policy (`kvslim tune`)") == "tuning-a-policy-kvslim-tune"
    assert check_docs.slug("Limits, access control, shutdown") == "limits-access-control-shutdown"
    assert (
        check_docs.slug("SnapKV prefill on needle retrieval (SmolLM2-135M, 1,024-token prompts)")
        == "snapkv-prefill-on-needle-retrieval-smollm2-135m-1024-token-prompts"
    )


def test_shell_lines_split_into_commands():
    assert check_docs.strip_comment('kvslim a --p "x # y" # comment') == 'kvslim a --p "x # y" '
    assert check_docs.strip_comment("curl http://h/a#b") == "curl http://h/a#b"
    line = 'for i in 0 1; do kvslim eval --shard $i/2 --out "o $i" & done; wait'
    cmds = list(check_docs.commands(line))
    assert ["do", "kvslim", "eval", "--shard", "$i/2", "--out", "o $i"] in cmds
    assert check_docs.kvslim_args(["do", "kvslim", "eval", "--shard", "1/2"]) == ["eval", "--shard", "1/2"]
    assert check_docs.kvslim_args(["KVSLIM_INT8=0", "target/release/kvslim", "info"]) == ["info"]
    assert check_docs.kvslim_args(["cargo", "run", "--release", "--", "generate"]) == ["generate"]
    assert check_docs.kvslim_args(["cargo", "run", "--release", "-p", "kvslim", "--", "fetch", "x"]) == ["fetch", "x"]
    assert check_docs.kvslim_args(["cargo", "run", "--release", "-p", "kvslim-server", "--example", "b", "--", "m"]) is None
    assert check_docs.kvslim_args(["cargo", "test", "--release"]) is None
    joined = list(check_docs.logical_lines(["kvslim perplexity \\", "  --json   # out", "", "kvslim info"], 10))
    assert joined == [(10, "kvslim perplexity    --json"), (13, "kvslim info")]
