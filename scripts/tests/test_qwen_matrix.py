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


def tasks(fields):
    """The task specs of RULER4K50 in `cut -f` range `fields`, as the groups' definitions take them."""
    r = subprocess.run(["bash", "-c", f'source <(sed -n "/^both_haystacks()/,/^}}/p;/^RULER4K50=/p" {SCRIPT}); '
                       f'echo "$RULER4K50" | cut -d";" -f{fields} | tr ";" "\\n"'], capture_output=True, text=True)
    return r.stdout.split()


def test_the_parts_of_the_0_5b_matrix_cover_its_thirteen_tasks_once():
    text = SCRIPT.read_text()
    # q05-ruler ran the first three tasks, q05-ruler-b the fourth, q05-ruler-c runs the rest
    assert "q05-ruler-b) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2" in text
    assert "closed after its first task" in run("run", "q05-ruler-b").stdout
    assert 'TASKS=$(echo "$RULER4K50" | cut -d\';\' -f5-)' in text
    assert 'TASKS=$(echo "$RULER4K50" | cut -d\';\' -f1-4)' in text  # q05-zip: the KVzip cells the first four lack
    everything, rest, zipped = tasks("1-"), tasks("5-"), tasks("1-4")
    assert len(everything) == 13 and everything == zipped + rest
    assert rest[0].startswith("niah_multikey:lengths=") and rest[-1].startswith("cwe:")
    assert zipped[3].startswith("niah_single:haystack=text,")


def test_the_deciding_tasks_give_cwe_its_50_items():
    """cwe has no depths, so RULER4K50's cwe holds ten items; DECIDE4K (the auto groups') and the
    cwe groups ask for 50, the first ten of which are RULER4K50's."""
    r = subprocess.run(["bash", "-c", f'source <(sed -n "/^both_haystacks()/,/^}}/p;/^RULER4K50=/p;/^CWE50=/p;/^DECIDE4K=/p" {SCRIPT}); '
                       'echo "$DECIDE4K" | tr ";" "\\n"'], capture_output=True, text=True)
    decide = r.stdout.split()
    assert decide[:-1] == tasks("1-12") and decide[-1] == "cwe:lengths=4096,per_cell=50"
    text = SCRIPT.read_text()
    block = text.split("    q05-cwe) ")[1].split(";;")[0]
    assert "TASKS=$CWE50" in block and 'POLICIES="$Q05;$ZIP"' in block and "pin $PIN_V2" in block
    # the 1.5B's cwe items run in q15-ruler-b: its tasks are DECIDE4K's after passkey's two
    block = text.split("    q15-ruler-b) ")[1].split(";;")[0]
    assert """TASKS=$(echo "$DECIDE4K" | cut -d';' -f3-)""" in block and 'POLICIES="$Q05;$ZIP;$ZAPF"' in block
