"""Tests of scripts/auto_table.py: the committed table is what the committed results give, and
editing a result without regenerating the table fails scripts/check_docs.py (on a copy)."""
import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def module(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m  # check_docs' dataclasses look their module up
    spec.loader.exec_module(m)
    return m


auto_table, check_docs = module("auto_table"), module("check_docs")


def copy(tmp):
    """The results auto_table.py reads and the committed table, under tmp."""
    for d in ("docs/tuned", "docs/qwen", "docs/contexts", "docs/results/default-rows"):
        shutil.copytree(ROOT / d, tmp / d)
    (tmp / auto_table.TABLE).parent.mkdir(parents=True)
    shutil.copy(ROOT / auto_table.TABLE, tmp / auto_table.TABLE)
    return tmp


def problems(root):
    report = check_docs.Report()
    check_docs.check_auto_table(root, report)
    return report.problems


def edit(path, policy, metric, value):
    """Sets `metric` of every row of `policy` in a result file (as a hand edit would)."""
    lines = [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines()]
    for r in lines:
        if r["policy"] == policy:
            r["metrics"][metric] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")


def rows(root):
    return json.loads((root / auto_table.TABLE).read_text(encoding="utf-8"))["rows"]


def test_the_committed_table_is_current():
    assert auto_table.check(ROOT) is None
    got = {(r["model"], r["use"], r["share"]): (r["score"], r["sinks"], r["heavy"], r["prefill"], r["alloc"])
           for r in rows(ROOT)}
    assert got[("qwen2:28x1536", "reply", 20.0)] == ("vnorm", 4, [1, 2], "snap:32", None)
    # the 0.5B's rankings are complete: its reply rows and the default rows are theirs, per share
    for model in ("qwen2:24x896", "*"):
        assert sorted(s for m, u, s in got if m == model and u == "reply") == [12.5, 25.0, 50.0], model
    table = {(r["model"], r["use"], r["share"]): r for r in rows(ROOT)}
    assert all("q05-cwe" in table[("qwen2:24x896", "reply", s)]["evidence"] for s in (12.5, 25.0, 50.0))
    # contexts: KVzap with KVzip's small recent window on both Qwen models; the 0.5B's from its
    # rankings' compress-once cells (the floor answers more at 25 and 12.5%), the 1.5B's from its
    # ten contexts until its rankings are complete
    assert got[("qwen2:24x896", "context", 12.5)] == ("sum", 0, [7, 8], "kvzap", "global:0.1")
    assert "q05-zapf" in table[("qwen2:24x896", "context", 12.5)]["evidence"]
    assert sorted(s for m, u, s in got if m == "qwen2:24x896" and u == "context") == [12.5, 25.0, 50.0]
    assert got[("qwen2:28x1536", "context", 12.5)] == ("sum", 0, [7, 8], "kvzap", "global")
    assert table[("qwen2:28x1536", "context", 12.5)]["evidence"] == "docs/contexts/reuse-q15/results.jsonl"
    # a default row needs no per-model file
    assert all(got[k][3] != "kvzap" for k in got if k[0] == "*")


def test_editing_a_result_without_regenerating_fails_the_check(tmp_path):
    root = copy(tmp_path)
    assert problems(root) == []
    # norm with 4 sinks now has Qwen's lowest KL
    edit(root / "docs/qwen/auto-kl/results.jsonl", "h2o:score=norm,sink=4", "kl", 0.01)
    found = problems(root)
    assert len(found) == 1 and auto_table.TABLE in found[0] and "python3 scripts/auto_table.py" in found[0]
    cli = [sys.executable, str(SCRIPTS / "auto_table.py"), "--root", str(root)]
    assert subprocess.run([*cli, "--check"], capture_output=True).returncode == 1
    # regenerating makes it pass again, with the new winner
    subprocess.run(cli, check=True, capture_output=True)
    assert problems(root) == []
    qwen = [r for r in rows(root) if r["model"] == "qwen2:28x1536" and r["use"] == "reply"]
    assert [(r["score"], r["prefill"]) for r in qwen] == [("norm", "snap:32")]


def test_a_compress_once_result_moves_the_context_rows(tmp_path):
    root = copy(tmp_path)
    # plain H2O now answers every question after compression on the 1.5B's ten contexts
    edit(root / "docs/contexts/reuse-q15/results.jsonl", "h2o", "recall", 1.0)
    assert problems(root)
    subprocess.run([sys.executable, str(SCRIPTS / "auto_table.py"), "--root", str(root)], check=True, capture_output=True)
    ctx = {(r["model"], r["share"]): (r["heavy"], r["prefill"], r["alloc"]) for r in rows(root) if r["use"] == "context"}
    assert ctx[("qwen2:28x1536", 12.5)] == ([1, 2], None, None)
    assert ctx[("qwen2:24x896", 12.5)] == ([7, 8], "kvzap", "global:0.1"), "the other model's rows stay"


def test_the_rankings_compress_once_cells_move_a_models_context_rows(tmp_path):
    """The 0.5B's rankings hold niah_multiquery at 50 contexts in both haystacks: its context rows
    are the most questions answered there (the recall of both cells), not its ten-context file's;
    a candidate short of 50 contexts, and its file's rows come back."""
    root = copy(tmp_path)
    qt = auto_table.qwen_tables
    groups = [root / "docs" / "qwen" / g for g in qt.DECIDE["Qwen2.5-Coder-0.5B"]]
    for g in groups:
        for f in g.glob("shard-*/results.jsonl"):
            edit(f, "h2o", "recall", 1.0)
    # the ruler rule reads per-item accuracy, so only the context rows move
    subprocess.run([sys.executable, str(SCRIPTS / "auto_table.py"), "--root", str(root)], check=True, capture_output=True)
    ctx = {r["share"]: r for r in rows(root) if r["model"] == "qwen2:24x896" and r["use"] == "context"}
    assert sorted(ctx) == [12.5, 25.0, 50.0]
    assert all((r["family"], r["prefill"]) == ("h2o", None) for r in ctx.values())
    assert all("100.0% of 400 questions (noise and text)" in r["why"] for r in ctx.values())
    reply = [r for r in rows(root) if r["model"] == "qwen2:24x896" and r["use"] == "reply"]
    assert {r["family"] for r in reply} == {qt.ZAPF}
    # H2O's real-text cell with ten contexts: the candidates are incomplete, the file decides
    for g in groups:
        for f in g.glob("shard-*/results.jsonl"):
            lines = [json.loads(l) for l in f.read_text(encoding="utf-8").splitlines()]
            for r in lines:
                if r["policy"] == "h2o" and r["task"].startswith("niah_multiquery:haystack=text"):
                    r["items"] = 10
            f.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    subprocess.run([sys.executable, str(SCRIPTS / "auto_table.py"), "--root", str(root)], check=True, capture_output=True)
    ctx = [r for r in rows(root) if r["model"] == "qwen2:24x896" and r["use"] == "context"]
    assert {r["evidence"] for r in ctx} == {"docs/contexts/reuse-q05/results.jsonl"}


def test_a_tuned_winner_moves_the_default_rows_until_a_ruler_group_is_complete(tmp_path):
    root = copy(tmp_path)
    for group in auto_table.qwen_tables.DECIDE["Qwen2.5-Coder-0.5B"]:
        shutil.rmtree(root / "docs" / "qwen" / group, ignore_errors=True)
    tuned = root / "docs/tuned/gemma-5.json"
    d = json.loads(tuned.read_text(encoding="utf-8"))
    d["spec"] = "h2o:heavy=13,recent=38,score=norm"
    tuned.write_text(json.dumps(d), encoding="utf-8")
    assert problems(root)
    subprocess.run([sys.executable, str(SCRIPTS / "auto_table.py"), "--root", str(root)], check=True, capture_output=True)
    assert sorted(r["share"] for r in rows(root) if r["model"] == "*" and r["use"] == "reply") == [10.0, 40.0]


def test_specs_parse_to_row_values():
    assert auto_table.parse("h2o:heavy=150,recent=50,sink=4,score=norm") == ("norm", 4, (150, 200), None, None)
    assert auto_table.parse("h2o:score=vnorm,sink=4") == ("vnorm", 4, (1, 2), None, None)
    assert auto_table.parse("h2o:heavy=15%,recent=5%") == ("sum", 0, (3, 4), None, None)
    assert auto_table.parse("h2o:prefill=snap:32") == ("sum", 0, (1, 2), "snap:32", None)
    for unexpressible in ("window", "h2o:agg=max,score=tova", "h2o:alloc=ada:0.2", "h2o:heavy=3"):
        assert auto_table.parse(unexpressible) is None
    # a context's rows may say more
    keys = auto_table.CONTEXT_KEYS
    got = auto_table.parse("h2o:recent_share=0.125,prefill=kvzap,alloc=global", keys)
    assert got == ("sum", 0, (7, 8), "kvzap", "global")
    assert auto_table.parse("h2o:recent_share=0.125,heavy=3", keys) is None


def test_a_complete_ruler_group_makes_the_models_reply_rows(tmp_path):
    """q05-ruler (synthetic shards): once every candidate has every task of both haystacks at 50
    items, the 0.5B gets reply rows with the best mean accuracy (KVzap-style with KVzip's budget
    here, named as the family the evaluation ran), and the default rows the best that needs no
    predictor; one task short, neither (the model keeps the defaults, the defaults their
    `until` rule)."""
    root = copy(tmp_path)
    qt = auto_table.qwen_tables
    groups = root / "docs" / "qwen"
    # the synthetic shards alone: the real groups fill in tasks as they land
    for part in qt.DECIDE["Qwen2.5-Coder-0.5B"]:
        shutil.rmtree(root / "docs" / "qwen" / part, ignore_errors=True)
    accuracy = {"full": 1.0, "h2o": 0.2, "h2o:prefill=snap:32": 0.9, "h2o:prefill=expect": 0.4, "window": 1.0,
                qt.ZAP: 0.94, qt.ZAPF: 0.92, qt.ZIP: 1.0}
    group_of = {qt.ZAP: "q05-zap2", qt.ZAPF: "q05-zapf"}

    def write(tasks):
        # the committed predictor's KVzap cells are q05-zap2's (q05-ruler's ran the first predictor)
        lines = {"q05-ruler": [], "q05-zap2": [], "q05-zapf": []}
        for t in tasks:
            spec = t.replace("+text", ":haystack=text,") + ("" if "+text" in t else ":") + "lengths=4096"
            for policy, a in accuracy.items():
                for share in ["-"] if policy == "full" else qt.DECIDE_SHARES:
                    per = [1.0] * round(50 * a) + [0.0] * (50 - round(50 * a))
                    lines[group_of.get(policy, "q05-ruler")].append(
                        {"policy": policy, "budget": share, "task": spec, "items": 50,
                         "metrics": {"acc": a}, "per_item": {"acc": per}, "git_commit": "ad48728"})
        for group, rows in lines.items():
            (groups / group / "shard-0").mkdir(parents=True, exist_ok=True)
            (groups / group / "shard-0" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    every = qt.KINDS["noise"] + qt.KINDS["text"]
    replies = lambda model: [r for r in json.loads(auto_table.table(root))["rows"]  # noqa: E731
                             if r["model"] == model and r["use"] == "reply"]
    write(every)
    got = replies("qwen2:24x896")
    assert [(r["share"], r["prefill"], r["alloc"], r["family"]) for r in got] == [
        (s, "kvzap", "global", qt.ZAP) for s in (50.0, 25.0, 12.5)]
    assert got[0]["heavy"] == [7, 8] and "94.0%" in got[0]["why"], "window is no H2O variant and KVzip costs 2x"
    default = replies("*")
    # the evidence: every group of the 0.5B's rankings holding a candidate (not `auto` alone)
    evidence = "docs/qwen/" + ", ".join(g for g, ps in qt.DECIDE["Qwen2.5-Coder-0.5B"].items() if ps != ["auto"])
    assert [(r["share"], r["family"], r["evidence"]) for r in default] == [
        (s, "h2o:prefill=snap:32", evidence) for s in (50.0, 25.0, 12.5)]
    assert "90.0% over qwen2:24x896 at" in default[0]["why"]
    write(every[:-1])
    assert not replies("qwen2:24x896")
    assert {r["evidence"] for r in replies("*")} == {"docs/results/tuning.md"}


def test_the_15b_keeps_its_kl_row_until_its_ruler_group_is_complete(tmp_path):
    root = copy(tmp_path)
    qt = auto_table.qwen_tables
    replies = lambda: [r for r in json.loads(auto_table.table(root))["rows"]  # noqa: E731
                       if r["model"] == "qwen2:28x1536" and r["use"] == "reply"]
    assert [r["evidence"] for r in replies()] == ["docs/qwen/auto-kl/results.jsonl"]
    lines = []
    for t in qt.KINDS["noise"] + qt.KINDS["text"]:
        spec = t.replace("+text", ":haystack=text,") + ("" if "+text" in t else ":") + "lengths=4096"
        for policy, a in {"full": 1.0, "h2o": 0.2, "h2o:prefill=snap:32": 0.9, "h2o:prefill=expect": 0.4, qt.ZAP: 0.8}.items():
            for share in ["-"] if policy == "full" else qt.DECIDE_SHARES:
                per = [1.0] * round(50 * a) + [0.0] * (50 - round(50 * a))
                lines.append({"policy": policy, "budget": share, "task": spec, "items": 50,
                              "metrics": {"acc": a}, "per_item": {"acc": per}, "git_commit": "7c54789"})
    group = root / "docs" / "qwen" / "q15-ruler" / "shard-0"
    group.mkdir(parents=True, exist_ok=True)
    (group / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    got = replies()
    assert [(r["share"], r["family"], r["evidence"]) for r in got] == [
        (s, "h2o:prefill=snap:32", "docs/qwen/q15-ruler, q15-ruler-b") for s in (50.0, 25.0, 12.5)]
    q05 = next(s for s in auto_table.SOURCES if s["model"] == "qwen2:24x896" and s["rule"] == "ruler")
    if auto_table.ruler_candidates(root, q05) is None:  # the 0.5B's rankings still running: the 1.5B's alone
        defaults = [r for r in json.loads(auto_table.table(root))["rows"] if r["model"] == "*" and r["use"] == "reply"]
        assert {(r["family"], r["evidence"]) for r in defaults} == {("h2o:prefill=snap:32", "docs/qwen/q15-ruler, q15-ruler-b")}


def test_a_tuned_models_needle_results_choose_its_rows_prefill(tmp_path):
    """Gemma 3's rows carry SnapKV's prefill because its needle results say so; when plain H2O
    finds every needle there instead, the rows carry none and the committed table is stale."""
    root = copy(tmp_path)
    gemma = lambda: [r for r in json.loads(auto_table.table(root))["rows"]  # noqa: E731
                     if r["model"] == "gemma3:18x640" and r["use"] == "reply"]
    assert {r["prefill"] for r in gemma()} == {"snap:32"}
    assert all("needles" in r["why"] for r in gemma())
    edit(root / "docs/results/default-rows/gemma-2k/results.jsonl", "h2o", "acc", 1.0)
    assert {r["prefill"] for r in gemma()} == {None}
    assert problems(root)
