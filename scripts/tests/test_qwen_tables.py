"""Tests of scripts/qwen_tables.py on small synthetic shards (not the real matrix): averages and
% of full, missing groups and cells, duplicate cells across shards, and the paired interval."""
import importlib.util
import json
import math
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("qwen_tables", ROOT / "scripts" / "qwen_tables.py")
qt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(qt)

COMMIT = "1930b9e5de4805185eeefa53338ab43626d26a1d"


def row(task, policy, budget, acc=None, **metrics):
    per_item = {"acc": acc} if acc is not None else {k: v if isinstance(v, list) else [v] for k, v in metrics.items()}
    metrics = {k: sum(v) / len(v) if isinstance(v, list) else v for k, v in metrics.items()}
    if acc is not None:
        metrics = {"acc": sum(acc) / len(acc), "recall": sum(acc) / len(acc)}
    return {"model": "qwen2.5-coder-1.5b", "policy": policy, "budget": budget, "task": f"{task}:lengths=4096,depths=0.5",
            "items": len(next(iter(per_item.values()))), "metrics": metrics, "per_item": per_item, "git_commit": COMMIT}


def shard(root, group, i, rows, extra=""):
    path = root / "docs" / "qwen" / group / f"shard-{i}" / "results.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + extra)


def fixture(root):
    h2o_ns = row("niah_single", "h2o", "50%", [0.0, 0.0, 1.0, 0.0])
    shard(root, "r4k", 0, [
        row("passkey", "full", "-", [1.0, 1.0, 1.0, 1.0]),
        row("passkey", "h2o", "50%", [1.0, 0.0, 1.0, 0.0]),
        row("passkey", "h2o:prefill=snap:32", "50%", [1.0, 1.0, 1.0, 1.0]),
        row("passkey", "window", "25%", [1.0, 1.0, 0.0, 0.0]),
        h2o_ns,
    ])
    shard(root, "r4k", 1, [
        row("niah_single", "full", "-", [1.0, 0.0, 1.0, 0.0]),
        h2o_ns,  # the same cell again: kept once
        row("niah_single", "window", "25%", [1.0, 0.0, 0.0, 0.0]),
    ], extra=json.dumps(row("passkey", "window", "25%", [0.0, 0.0, 0.0, 0.0])) + '\n{"policy": "h2o", "bud')
    # auto − h2o on passkey: differences 1, 0, 0, −1, 1 (paired.rs's own hand-computed case)
    shard(root, "r4k-auto", 0, [
        row("passkey", "full", "-", [1.0] * 5),
        row("passkey", "auto", "50%", [1.0, 1.0, 0.0, 0.0, 1.0]),
        row("passkey", "h2o", "50%", [0.0, 1.0, 0.0, 1.0, 0.0]),
        row("passkey", "auto", "25%", [0.0] * 5),
        row("passkey", "h2o:prefill=snap:32", "25%", [1.0] * 5),
        row("passkey", "h2o", "25%", [0.0] * 5),
    ])
    shard(root, "lcc-a", 0, [
        row("lcc", "full", "-", edit_sim=0.5, exact=0.25),
        row("lcc", "h2o", "50%", edit_sim=0.48, exact=0.25),
        row("lcc", "window", "50%", edit_sim=0.2, exact=0.0),
        # auto − h2o per item: edit similarity +0.1, +0.1, +0.1, +0.1 (interval [+0.1, +0.1]); exact 0 everywhere
        row("lcc", "auto", "25%", edit_sim=[0.6, 0.5, 0.4, 0.3], exact=[0.0] * 4),
        row("lcc", "h2o", "25%", edit_sim=[0.5, 0.4, 0.3, 0.2], exact=[0.0] * 4),
    ])


def line(table, start):
    return next(l for l in table.splitlines() if l.startswith(start))


def test_paired_interval_matches_paired_rs():
    n, d, lo, hi = qt.paired([1.0, 1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0, 0.0])
    half = 2.776 * math.sqrt(0.7 / 5)
    assert n == 5 and abs(d - 0.2) < 1e-12 and abs(lo - (0.2 - half)) < 1e-9 and abs(hi - (0.2 + half)) < 1e-9
    assert qt.paired([1.0], [0.0]) is None and qt.paired([1.0, 0.0], [0.0]) is None
    assert qt.t975(40) == 1.96


def test_averages_percent_of_full_and_missing_cells(tmp_path):
    fixture(tmp_path)
    cells, notes = qt.load(tmp_path)
    table = qt.average_table(cells)
    assert table.splitlines()[0] == "| policy | 75% kept (ratio 0.25) | 50% kept (ratio 0.5) | 25% kept (ratio 0.75) | 12.5% kept (ratio 0.875) |"
    # full: (1 + 0.5) / 2 over the two tasks it has
    assert line(table, "| full cache") == "| full cache `full` | 0.75 [2/6] | 0.75 [2/6] | 0.75 [2/6] | 0.75 [2/6] |"
    # h2o 50%: (0.5 + 0.25) / 2 = 0.375 against 0.75 → 50%; nothing at the other shares
    assert line(table, "| H2O `h2o`") == "| H2O `h2o` | – | 0.38 (50%) [2/6] | – | – |"
    # SnapKV has passkey only: averaged over that task alone, against full's passkey (1.0)
    assert line(table, "| SnapKV") == "| SnapKV `h2o:prefill=snap:32` | – | 1.00 (100%) [1/6] | – | – |"
    # auto against r4k-auto's own full cache (passkey 1.0), not r4k's
    assert line(table, "| auto") == "| auto `auto` | – | 0.60 (60%) [1/6] | 0.00 (0%) [1/6] | – |"
    assert line(table, "| KVzip") == "| KVzip-style `h2o:prefill=kvzip` | – | – | – | – |"
    tasks = qt.task_table(cells)
    assert line(tasks, "| H2O `h2o`") == "| H2O `h2o` | – / 0.5 / – / – | – / 0.25 / – / – | – | – | – | – |"
    assert line(tasks, "| full cache") == "| full cache `full` | 1 | 0.5 | – | – | – | – |"
    # the window 25% passkey cell differs between the shards: left out and reported
    assert line(tasks, "| window") == "| window `window` | – | – / – / 0.25 / – | – | – | – | – |"
    assert any("passkey window 25%" in n and "left out" in n for n in notes)
    assert any("shard-1/results.jsonl:5: not a result row" in n for n in notes)
    assert sum("left out" in n for n in notes) == 1, "the identical h2o copy is not a conflict"
    cover = qt.coverage(cells)
    assert line(cover, "| r4k |").startswith("| r4k | 1930b9e | 3/41 | 3/41 | 0/41 |")
    assert line(cover, "| r4k-z |") == "| r4k-z | – | 0/9 | 0/9 | 0/9 | 0/9 | 0/9 | 0/9 | 0/9 |  |"
    assert line(cover, "| lcc-a |").endswith("| 5/25 |")


def test_code_completion_and_acceptance(tmp_path):
    fixture(tmp_path)
    cells, _ = qt.load(tmp_path)
    assert line(qt.metric_table(cells, "lcc", "edit_sim", 3), "| H2O") == "| H2O `h2o` | – | 0.480 (96%) | 0.350 (70%) | – |"
    assert line(qt.metric_table(cells, "lcc", "exact", 3), "| full") == "| full cache `full` | 0.250 | 0.250 | 0.250 | 0.250 |"
    assert all(l.endswith("| – | – | – | – |") for l in qt.metric_table(cells, "niah_multiquery", "recall", 2).splitlines()[2:])
    acc = qt.acceptance(cells).splitlines()
    # only the policies covering the most tasks (h2o: 2, SnapKV: 1) compete for best
    assert "| best RULER-4K average | 50% | H2O: 50% of full over 2/6 tasks | ≥ 95% of full | not met (provisional) |" in acc
    assert "| best code-completion edit similarity | 50% | H2O: 96% of full | ≥ 95% of full | met |" in acc
    assert "| one policy meeting both | 50% | none | both of the above | none |" in acc
    assert "| best code-completion edit similarity | 25% | auto: 90% of full | ≥ 85% of full | met |" in acc
    assert line("\n".join(acc), "| `auto` − H2O `h2o`, RULER-4K items, paired | 50% |") == (
        "| `auto` − H2O `h2o`, RULER-4K items, paired | 50% | +0.20 [−0.84, +1.24] over 5 items (1/6 tasks) "
        "| better / worse: the 95% interval excludes 0 | within interval |")
    assert line("\n".join(acc), "| `auto` − SnapKV `h2o:prefill=snap:32`, RULER-4K items, paired | 25% |").endswith(
        "−1.00 [−1.00, −1.00] over 5 items (1/6 tasks) | better / worse: the 95% interval excludes 0 | worse |")
    assert line("\n".join(acc), "| `auto` − H2O `h2o`, RULER-4K items, paired | 75% |").endswith("| not measured yet | better / worse: the 95% interval excludes 0 | not measured yet |")
    assert line("\n".join(acc), "| `auto` − H2O `h2o`, code completion edit similarity, paired | 25% |").endswith(
        "| +0.10 [+0.10, +0.10] over 4 items | better / worse: the 95% interval excludes 0 | better |")
    assert line("\n".join(acc), "| `auto` − H2O `h2o`, code completion exact match, paired | 25% |").endswith(
        "| +0.00 [+0.00, +0.00] over 4 items | better / worse: the 95% interval excludes 0 | within interval |")
    assert line("\n".join(acc), "| `auto` − SnapKV `h2o:prefill=snap:32`, code completion edit similarity, paired | 25% |").endswith(
        "| not measured yet | better / worse: the 95% interval excludes 0 | not measured yet |")


def test_main_prints_every_section_with_no_results_at_all(tmp_path, capsys):
    qt.main(["--root", str(tmp_path)])
    out = capsys.readouterr().out
    for title in ("Coverage", "RULER-4K average", "Per task", "Compress once, ask many", "Code completion: edit similarity", "Acceptance (issue #34)"):
        assert f"## {title}\n" in out
    assert "| full cache `full` | – | – | – | – |" in out and "not measured yet" in out


def test_summary_prints_only_the_headline(tmp_path, capsys):
    qt.main(["--root", str(tmp_path), "--summary"])
    out = capsys.readouterr().out
    assert out.startswith("| policy | 0.5B noise | 0.5B real text | 1.5B noise | 1.5B real text |") and "## " not in out
    assert "| full cache `full` | – | – | – | – |" in out


def test_the_headline_marks_significant_losses_and_counts_items_per_share(tmp_path):
    def task_row(task, policy, budget, acc):
        r = row(task, policy, budget, acc)
        r["task"] = task + ":lengths=4096"
        return r
    shard(tmp_path, "q05-ruler", 0, [
        task_row("passkey", "full", "-", [1.0] * 6),
        task_row("passkey", "h2o", "50%", [1.0] * 6),          # even
        task_row("passkey", "h2o", "25%", [1.0, 0.0] * 3),     # −0.5, interval below 0
        task_row("passkey", "h2o", "12.5%", [0.0] * 6),        # −1
        task_row("passkey", qt.SNAP, "50%", [1.0] * 6),       # only one share so far
    ])
    cells, _ = qt.load(tmp_path, ["q05-ruler"])
    text = qt.headline(cells)
    assert line(text, "| full cache").startswith("| full cache `full` | 1.00 · 6 [1/7] | – |")
    assert "| 1.00 / 0.50↓ / 0.00↓ · 6 [1/7] | – |" in line(text, "| H2O `h2o`")
    assert "| 1.00 / – / – · 6/0/0 [1/7] |" in line(text, "| SnapKV")


def test_write_rewrites_only_the_generated_parts(tmp_path):
    (tmp_path / "docs" / "qwen").mkdir(parents=True)
    results = tmp_path / "docs" / "qwen" / "results.md"
    results.write_text("# intro\n\n<!-- generated: python3 scripts/qwen_tables.py -->\n\nold tables\n")
    readme = tmp_path / "README.md"
    readme.write_text("top\n<!-- generated: python3 scripts/qwen_tables.py --summary -->\n\n| old | table |\n|---|---|\n\nprose after\n")
    qt.main(["--root", str(tmp_path), "--write"])
    text = results.read_text()
    assert text.startswith("# intro\n\n<!-- generated: python3 scripts/qwen_tables.py -->\n\n## Coverage\n")
    assert "old tables" not in text
    lines = readme.read_text().split("\n")
    assert lines[:3] == ["top", "<!-- generated: python3 scripts/qwen_tables.py --summary -->", ""]
    assert lines[3].startswith("| policy | 0.5B noise") and "| old | table |" not in lines
    assert lines[-3:] == ["", "prose after", ""]


def test_write_can_read_the_shards_from_another_copy(tmp_path):
    """--results: the tables come from that copy's shards (the committed journals), the files
    written are ROOT's; a row only the working tree has stays out."""
    work, committed = tmp_path / "work", tmp_path / "committed"
    (work / "docs" / "qwen").mkdir(parents=True)
    (work / "docs" / "qwen" / "results.md").write_text("<!-- generated: python3 scripts/qwen_tables.py -->\n")
    (work / "README.md").write_text("<!-- generated: python3 scripts/qwen_tables.py --summary -->\n\n| old |\n")
    shard(committed, "q05-ruler", 0, [row("passkey", "full", "-", [1.0, 0.0])])
    shard(work, "q05-ruler", 0, [row("passkey", "full", "-", [1.0, 0.0]), row("passkey", "h2o", "25%", [0.0, 0.0])])
    qt.main(["--root", str(work), "--results", str(committed), "--write"])
    readme = (work / "README.md").read_text()
    assert "| full cache `full` | 0.50 · 2 [1/7] |" in readme
    assert "| H2O `h2o` | – |" in readme, "the working tree's extra row is not in the committed journals"
    assert not (committed / "README.md").exists()


def test_the_stratified_bootstrap_pairs_items_within_tasks():
    # equal differences: the interval is the point
    assert qt.stratified([([1.0, 1.0], [0.0, 0.0]), ([0.5, 0.5], [0.5, 0.5])], seed=0) == (0.5, 0.5, 0.5)
    # a spread of differences: the mean of the task means, inside its interval, the same twice
    pairs = [([1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]), ([0.0] * 4, [1.0, 0.0, 0.0, 0.0])]
    mean, lo, hi = qt.stratified(pairs, seed=0)
    assert math.isclose(mean, (0.5 - 0.25) / 2) and lo < mean < hi
    assert qt.stratified(pairs, seed=0) == (mean, lo, hi)


def test_decide_tables_pair_groups_by_task_and_item(tmp_path):
    """A policy from a second group (q05-zip) pairs with the first group's full cache item by item."""
    def task_row(task, policy, budget, acc):
        r = row(task, policy, budget, acc)
        r["task"] = task.replace("+text", "") + (":haystack=text," if "+text" in task else ":") + "lengths=4096"
        return r
    shard(tmp_path, "q05-ruler", 0, [task_row("passkey", "full", "-", [1.0, 1.0, 0.0, 1.0]),
                                     task_row("passkey+text", "full", "-", [1.0] * 4)])
    shard(tmp_path, "q05-zip", 0, [task_row("passkey", qt.ZIP, "25%", [1.0, 0.0, 0.0, 1.0])])
    cells, _ = qt.load(tmp_path, ["q05-ruler", "q05-zip"])
    text = qt.decide_tables(cells)
    assert "| full cache `full` | 0.75 · 4 [1/7] |" in text
    assert "0.50 · −0.25 [" in text and "· 4 [1/7] |" in text


def test_cwe_ranks_from_its_50_item_group(tmp_path):
    """q05-cwe's cwe cells (50 items) come before q05-ruler-c's (ten, the same first ten): the
    rankings pair them with q05-cwe's full cache, never the ten-item one."""
    shard(tmp_path, "q05-ruler-c", 0, [row("cwe", "full", "-", [1.0] * 10), row("cwe", "h2o", "25%", [1.0] * 10)])
    shard(tmp_path, "q05-cwe", 0, [row("cwe", "full", "-", [1.0] * 10 + [0.0] * 40),
                                   row("cwe", "h2o", "25%", [1.0] * 5 + [0.0] * 45)])
    cells, _ = qt.load(tmp_path, ["q05-cwe", "q05-ruler-c"])
    groups = list(qt.DECIDE["Qwen2.5-Coder-0.5B"])
    assert groups.index("q05-cwe") < groups.index("q05-ruler-c")
    assert len(qt.decide_cells(cells, groups, "cwe", "h2o", "25%")) == 50
    assert qt.decide_pairs(cells, groups, ["cwe"], "h2o", "full", "25%") == [([1.0] * 5 + [0.0] * 45, [1.0] * 10 + [0.0] * 40)]


def test_an_earlier_predictors_kvzap_cells_rank_apart_from_the_committed_ones(tmp_path):
    """q05-ruler's KVzap cells (the first predictor) and q05-zap2's (the committed one) carry one
    policy string; the rankings show them as two rows, each paired with the full cache."""
    shard(tmp_path, "q05-ruler", 0, [row("passkey", "full", "-", [1.0] * 4), row("passkey", qt.ZAP, "25%", [0.0, 0.0, 1.0, 1.0])])
    shard(tmp_path, "q05-zap2", 0, [row("passkey", qt.ZAP, "25%", [1.0, 1.0, 1.0, 0.0])])
    cells, _ = qt.load(tmp_path, ["q05-zap2", "q05-ruler"])
    noise = qt.decide_tables(cells).split("noise haystacks")[1]
    assert line(noise, f"| KVzap-style (contexts) `{qt.ZAP}` |").startswith(f"| KVzap-style (contexts) `{qt.ZAP}` | – | 0.75 · −0.25 [")
    assert "| – | 0.50 · −0.50 [" in line(noise, "| KVzap-style (contexts), first predictor (WikiText-2 alone)")


def test_the_rankings_groups_stay_out_of_the_15b_tables(tmp_path, capsys):
    """A 0.5B cell (q05-ruler) shows in the rankings, never in the 1.5B matrix's tables."""
    fixture(tmp_path)
    shard(tmp_path, "q05-ruler", 0, [row("passkey", qt.ZAP, "25%", [1.0, 1.0, 1.0, 1.0]),
                                     row("passkey", "full", "-", [1.0, 1.0, 1.0, 1.0])])
    qt.main(["--root", str(tmp_path)])
    out = capsys.readouterr().out
    before, after = out.split("## Rankings that decide")
    assert qt.ZAP not in before
    assert qt.ZAP in after and "1.00 · +0.00" in after


def test_code_completion_ranks_by_its_own_metric_and_8k_apart_from_4k(tmp_path):
    """q05-lcc's cells rank by edit similarity and exact match item by item; a q05-r8k cell shows in
    the 8K tables only, though its task's name is the 4K one's."""
    shard(tmp_path, "q05-lcc", 0, [row("lcc", "full", "-", edit_sim=[0.5, 0.7], exact=[0.0, 1.0]),
                                   row("lcc", "auto", "25%", edit_sim=[0.4, 0.7], exact=[0.0, 1.0]),
                                   row("lcc", "h2o", "25%", edit_sim=[0.2, 0.5], exact=[0.0, 0.0])])
    shard(tmp_path, "q05-r8k", 0, [row("passkey", "full", "-", [1.0, 0.0])])
    cells, _ = qt.load(tmp_path, ["q05-lcc", "q05-r8k"])
    text = qt.decide_tables(cells)
    lcc = text.split("code completion (LCC, all 117 items), edit similarity:**")[1]
    assert "| full cache `full` | 0.60 · 2 |" in lcc
    assert "| auto `auto` | – | 0.55 · −0.05 [" in lcc
    exact = text.split("exact match:**")[1]
    assert "| H2O `h2o` | – | 0.00 · −0.50 [" in exact
    # auto − h2o in edit similarity: +0.2 on both items
    assert "+0.20 [+0.20, +0.20] better · 2" in lcc.split("`auto` − each policy")[1]
    at8k = text.split("Qwen2.5-Coder-0.5B at 8,192 tokens, noise haystacks")[1]
    assert "| full cache `full` | 0.50 · 2 [1/7] |" in at8k
    assert "0.50 · 2" not in text.split("Qwen2.5-Coder-0.5B at 8,192 tokens")[0]


def test_kvzap_against_kvzip_pairs_items_and_checks_both_bars(tmp_path):
    """Issue #50's checks: KVzap's share of KVzip's mean over the items both ran (95% bar), and
    the probe's questions answered after compression on real text against full's (90% bar)."""
    def task_row(task, policy, budget, acc, recall=None):
        r = row(task, policy, budget, acc)
        r["task"] = task.replace("+text", "") + (":haystack=text," if "+text" in task else ":") + "lengths=4096"
        if recall is not None:
            r["metrics"]["recall"] = recall
        return r
    shard(tmp_path, "q05-zap2", 0, [task_row("passkey", qt.ZAP, "25%", [1.0, 1.0, 0.0, 1.0])])
    # q05-ruler-c's KVzap cells ran the first predictor: rows of their own
    shard(tmp_path, "q05-ruler-c", 0, [
        task_row("passkey", qt.ZAP, "25%", [0.0, 0.0, 0.0, 1.0]),
        task_row("passkey", qt.ZIP, "25%", [1.0, 1.0, 1.0, 1.0]),
        task_row("niah_multiquery+text", "full", "-", [1.0, 1.0], recall=1.0),
        task_row("niah_multiquery+text", qt.ZIP, "25%", [1.0, 0.0], recall=0.875),
    ])
    cells, _ = qt.load(tmp_path, ["q05-zap2", "q05-ruler-c"])
    text = qt.zap_versus_zip(cells)
    got = line(text, "| Qwen2.5-Coder-0.5B | committed | noise | RULER average | 25% |")
    assert "| 0.75 | 1.00 | −0.25 [" in got and "| 4 | 75%: not met (provisional: 1/6 tasks) |" in got
    got = line(text, "| Qwen2.5-Coder-0.5B | first (WikiText-2) | noise | RULER average | 25% |")
    assert "| 0.25 | 1.00 | −0.75 [" in got and "| 25%: not met" in got
    assert line(text, "| Qwen2.5-Coder-0.5B | committed | noise | RULER average | 12.5% |").endswith("| not measured yet |")
    assert "| Qwen2.5-Coder-1.5B | first" not in text, "the 1.5B has no earlier predictor's cells"
    assert line(text, "| Qwen2.5-Coder-0.5B | 0.875") == "| Qwen2.5-Coder-0.5B | 0.875 (2 contexts) | 1.000 | 88%: not met |"
    assert line(text, "| Qwen2.5-Coder-1.5B | –") == "| Qwen2.5-Coder-1.5B | – | – | not measured yet |"


def test_auto_is_checked_item_by_item_against_its_rows_family(tmp_path):
    """`auto` at each share against the family its nearest row names (a tie to the larger share),
    item by item over the rankings' cells; on niah_multiquery (compressed once, asked after) the
    nearest context row's family; a model without rows of its own says so."""
    table = tmp_path / "crates" / "cache" / "src" / "policy" / "auto_table.json"
    table.parent.mkdir(parents=True)
    rows = [{"model": "qwen2:24x896", "use": "reply", "share": 25.0, "family": qt.ZAP, "why": "-"},
            {"model": "qwen2:24x896", "use": "reply", "share": 50.0, "family": qt.SNAP, "why": "-"},
            {"model": "qwen2:24x896", "use": "context", "share": 12.5, "family": "h2o", "why": "-"}]
    table.write_text(json.dumps({"rows": rows}))

    def task_row(task, policy, budget, acc):
        r = row(task, policy, budget, acc)
        r["task"] = task + ":lengths=4096"
        return r
    shard(tmp_path, "q05-auto2", 0, [task_row("passkey", "auto", "25%", [1.0, 0.0, 1.0]),
                                     task_row("passkey", "auto", "12.5%", [1.0, 1.0, 1.0]),
                                     task_row("passkey", "auto", "50%", [1.0, 1.0, 1.0])])
    shard(tmp_path, "q05-zap2", 0, [task_row("passkey", qt.ZAP, "25%", [1.0, 0.0, 1.0]),
                                    task_row("passkey", qt.ZAP, "12.5%", [1.0, 0.0, 1.0])])
    shard(tmp_path, "q05-ruler", 0, [task_row("passkey", "auto", "25%", [0.0, 0.0, 0.0]),
                                     task_row(qt.MQ, "h2o", "25%", [0.0, 1.0]),
                                     task_row(qt.MQ, qt.ZAP, "25%", [1.0, 1.0])])
    shard(tmp_path, "q05-auto3", 0, [task_row(qt.MQ, "auto", "25%", [0.0, 1.0])])
    cells, _ = qt.load(tmp_path, ["q05-auto3", "q05-auto2", "q05-zap2", "q05-ruler"])
    text = qt.auto_as_its_rows(cells, tmp_path)
    # niah_multiquery's auto cell equals the context row's H2O, not the reply row's KVzap
    context = f"; compressed once ({qt.MQ}): 12.5%: `h2o`"
    assert line(text, "| Qwen2.5-Coder-0.5B | 25% |").endswith(f"| 25%: `{qt.ZAP}`{context} | 5 / 5 | the same |")
    assert line(text, "| Qwen2.5-Coder-0.5B | 12.5% |").endswith("| 2 / 3 | differs: rerun auto's group |")
    assert line(text, "| Qwen2.5-Coder-0.5B | 50% |").endswith("| – | not measured yet |")
    assert "none of its own yet" in line(text, "| Qwen2.5-Coder-1.5B | 50% |")
