"""Tests of scripts/qwen_matrix.sh's group table without running a group: a closed group says why
and starts nothing, an unknown group is refused, and every queued group's name is known."""
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "qwen_matrix.sh"


def run(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_a_closed_group_says_why_and_builds_nothing():
    r = run("run", "q05-ruler")
    assert r.returncode == 0, r.stderr
    assert "closed after its first three tasks" in r.stdout
    assert "worktree" not in r.stdout + r.stderr


def test_an_unknown_group_is_refused_before_anything_starts():
    r = run("queue", "q05-ruler-b", "no-such-group")
    assert r.returncode == 2
    assert "unknown group `no-such-group`" in r.stderr


def test_the_second_part_holds_the_ten_tasks_the_first_did_not_run():
    text = SCRIPT.read_text()
    assert "q05-ruler-b) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2" in text
    # the part's tasks: the 13 of RULER4K50 after the first three (the `cut` in its definition)
    r = subprocess.run(["bash", "-c", f'source <(sed -n "/^both_haystacks()/,/^}}/p;/^RULER4K50=/p" {SCRIPT}); '
                       'echo "$RULER4K50" | cut -d";" -f4- | tr ";" "\\n"'], capture_output=True, text=True)
    tasks = r.stdout.split()
    assert len(tasks) == 10
    assert tasks[0].startswith("niah_single:haystack=text,") and tasks[-1].startswith("cwe:")
