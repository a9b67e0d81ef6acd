"""Tests of the analysis scripts: whole_tables.py and choice_bias.py on the committed whole-set merge, ruler_tables.py on a small results file, bench_serving.py's prompts."""
import importlib.util
import json
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
ruler_tables = load("ruler_tables")
bench_serving = load("bench_serving")


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


def test_ruler_tables_put_each_length_and_depth_in_order_and_full_first(tmp_path):
    def row(task, policy, budget, by_len, by_depth):
        metrics = {"acc": sum(by_len) / len(by_len), "recall": 1.0}
        metrics.update({f"acc_len{L}": a for L, a in zip((1024, 8000, 2048), by_len)})
        metrics.update({f"acc_depth{d}": a for d, a in zip((0.9, 0.1), by_depth)})
        return json.dumps({"task": f"{task}:lengths=1024,2048,8000", "policy": policy, "budget": budget, "metrics": metrics})

    path = tmp_path / "results.jsonl"
    path.write_text("\n".join([
        row("vt", "h2o", "10%", [0.0, 0.0, 1.0], [0.0, 0.5]),
        row("vt", "h2o", "20%", [1.0, 0.0, 1.0], [1.0, 0.5]),
        row("vt", "full", "-", [1.0, 1.0, 1.0], [1.0, 1.0]),
        row("mc", "full", "-", [0.0, 0.0, 0.0], [0.0, 0.0]),
    ]) + "\n")
    rows = ruler_tables.load(path)
    assert {k[0] for k in rows} == {"vt"}, "only long-context tasks are read"
    lines = ruler_tables.table(rows, "acc_len", "length").splitlines()
    assert lines[2] == "| policy | budget | vt (1024 / 2048 / 8000) |"
    assert lines[4:] == ["| full | — | 1 / 1 / 1 |", "| h2o | 20% | 1 / 1 / 0 |", "| h2o | 10% | 0 / 1 / 0 |"]
    depth = ruler_tables.table(rows, "acc_depth", "depth").splitlines()
    assert depth[2] == "| policy | budget | vt (0.1 / 0.9) |" and depth[6] == "| h2o | 10% | 0.5 / 0 |"
    assert ruler_tables.overall(rows).splitlines()[4] == "| full | — | 1.00 (1.00) | 1.00 |"


def test_serving_prompts_share_no_text_even_when_items_repeat_a_file():
    # two items of one file (one context a prefix of the other) and a second file
    a, b = "".join(f"line {i}\n" for i in range(400)), "".join(f"row {i}\n" for i in range(300))
    got = bench_serving.pieces([a[:1500], a, b], 1000, 5)
    assert len(got) == 5 and len(set(got)) == 5
    assert got[:2] == [a[:1000], b[:1000]]  # file by file in turn
    assert all(len(p) == 1000 for p in got)
    assert not any(p in q or q in p for i, p in enumerate(got) for q in got[:i])


def test_bench_serving_engine_flags():
    assert bench_serving.kvslim_engine("full:kv_dtype=f16") == ("full:kv_dtype=f16", [])
    assert bench_serving.kvslim_engine("full --mixed-chunk 0") == ("full", ["--mixed-chunk", "0"])
