"""Tests of the analysis scripts (whole_tables.py, choice_bias.py) on the committed whole-set merge."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
MERGED = ROOT / "docs" / "whole" / "merged" / "results.md"


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


whole_tables = load("whole_tables")
choice_bias = load("choice_bias")


def test_points_converts_a_difference_and_keeps_the_significance_mark():
    assert whole_tables.points("-0.1000 [-0.1985, -0.0015] *") == "−10.0 *"
    assert whole_tables.points("+0.0011 [-0.0108, +0.0130]") == "+0.1"
    assert whole_tables.points("") == ""


def test_summary_has_one_row_per_finished_cell_with_the_merge_values():
    tables, _ = whole_tables.parse(MERGED)
    budgets = whole_tables.budgets_of(tables)
    rows = whole_tables.summary_table(tables, budgets).splitlines()[3:]
    ppl = tables[("wiki", "ppl")]
    finished = [(p, b) for p in whole_tables.POLICIES for b in budgets if ppl.get(p, {}).get(b)]
    assert [tuple(r.strip("| ").split(" | ")[:2]) for r in rows] == finished
    assert len(finished) == len(whole_tables.POLICIES) * 4, "the committed merge is the whole 5 × 4 matrix"
    diffs = tables[("piqa_llmfoundry", "acc − full, paired 95% CI")]
    for row in rows:
        cells = row.strip("| ").split(" | ")
        policy, budget, piqa = cells[0], cells[1], cells[3]
        assert piqa == whole_tables.points(diffs[policy][budget])
        assert cells[-1].startswith(ppl[policy][budget] + " (")


def test_full_tables_carry_every_task_the_merge_has():
    tables, items = whole_tables.parse(MERGED)
    header = whole_tables.accuracy_table(tables, items, "acc", whole_tables.budgets_of(tables)).splitlines()[0]
    for stem, name in whole_tables.TASKS:
        assert f"{name} ({items[stem]:,})" in header


def test_two_choice_picks_follow_from_correctness_and_gold():
    golds, counts = [1, 0, 1, 0], [2, 2, 2, 2]
    row = {"per_item": {"acc": [1.0, 1.0, 0.0, 0.0]}}
    assert choice_bias.picks_of(row, "acc", golds, counts) == [1, 0, 0, 1]


def test_recorded_picks_win_and_many_choices_without_them_are_unknown():
    row = {"per_item": {"acc": [1.0, 0.0], "pick": [2, 3]}}
    assert choice_bias.picks_of(row, "acc", [2, 1], [4, 4]) == [2, 3]
    assert choice_bias.picks_of({"per_item": {"acc": [1.0, 0.0]}}, "acc", [2, 1], [4, 4]) is None
