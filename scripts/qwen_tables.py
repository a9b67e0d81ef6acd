#!/usr/bin/env python3
"""Tables of the Qwen2.5-Coder-1.5B fidelity matrix (issue #34), straight from its shards.

Reads docs/qwen/GROUP/shard-*/results.jsonl of the groups of scripts/qwen_matrix.sh
(r4k, r4k-z, r4k-auto, lcc-a; r4k-a is superseded and not read) and prints Markdown:

  0. coverage: finished / expected cells per group and task, and the commit they ran at;
  1. RULER-4K average: per policy × kept share, the mean accuracy over the six RULER tasks
     and its % of the full cache's mean over the same tasks (only tasks measured for both);
  2. accuracy per RULER task at 75 / 50 / 25 / 12.5% kept;
  3. compress once, ask many (niah_multiquery): share of the questions answered, % of full;
  4. code completion (lcc): edit similarity and exact match, % of full;
  5. the acceptance checks of issue #34: the best policy at 50% (25%) kept against 95% (85%)
     of full, and `auto` against paper H2O and SnapKV, paired by item.

A row is compared with the full cache of its own group (same build, same items); a policy in
several groups is shown from the first group of GROUPS that has it for the task (`auto`'s
H2O and SnapKV references are r4k-auto's own cells). `--shard i/2` splits a group by cell
(round robin over the cell list), so a cell sits in one shard: a cell found twice is kept once
when both copies agree (commit, items, per-item values) and is left out as a conflict
otherwise. Missing groups, tasks and cells print as "–"; the coverage table says which.

Paired differences follow kvslim's crates/eval/src/paired.rs: the mean per-item difference
with a 95% t-interval from the differences' own spread (Student's t to 30 degrees of freedom,
then 1.96); no bootstrap.

Usage: python3 scripts/qwen_tables.py [--root DIR]   (DIR: the repository; default this one)
"""
import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ruler_tables import TASKS as RULER, fmt  # noqa: E402  (the six RULER tasks, "1 / 0.5" numbers)

SHARES = ["75%", "50%", "25%", "12.5%"]
SNAP = "h2o:prefill=snap:32"
A = ["full", "h2o", SNAP, "window", "sink"]
B = ["h2o:agg=max,score=tova", "h2o:score=norm", "h2o:score=vnorm", "h2o:alloc=pyramid:0.5", "h2o:alloc=ada:0.2"]
MQ, LCC = "niah_multiquery", "lcc"
# group: (policies, tasks, kept shares), as group() in scripts/qwen_matrix.sh defines them
GROUPS = {
    "r4k": (A + B + ["h2o:prefill=expect"], RULER + [MQ], SHARES),
    "r4k-z": (["full", "h2o:prefill=kvzip", "h2o:prefill=rkv"], RULER + [MQ], SHARES),
    "r4k-auto": (["full", "auto", "h2o", SNAP], RULER + [MQ], SHARES),
    "lcc-a": (A + ["h2o:agg=max,score=tova", "auto"], [LCC], SHARES),
}
NAMES = {
    "full": "full cache", "h2o": "H2O", SNAP: "SnapKV", "window": "window", "sink": "sink",
    "h2o:agg=max,score=tova": "TOVA", "h2o:score=norm": "H2O norm. sums", "h2o:score=vnorm": "H2O value norms",
    "h2o:alloc=pyramid:0.5": "PyramidKV", "h2o:alloc=ada:0.2": "AdaKV", "h2o:prefill=expect": "Expected Attention",
    "h2o:prefill=kvzip": "KVzip-style", "h2o:prefill=rkv": "ADAPTIVE_RKV-style", "auto": "auto",
}
BARS = {"50%": 95, "25%": 85}
DASH = "–"

# Rankings that decide (issue #49): 50 items per task, every needle task in both haystacks
# (noise and real text), per model the groups that hold its cells, the first group with a
# policy's cells of a task being the one shown; a group's cells pair with another group's by
# task and item index (the same task specs make the same items)
NEEDLES = ["passkey", "niah_single", "niah_multikey", "niah_multivalue", "vt", MQ]
KINDS = {"noise": NEEDLES + ["cwe"], "text": [t + "+text" for t in NEEDLES]}
# niah_multiquery in both haystacks: compressed once, asked after (`auto` runs its context rows there)
COMPRESS_ONCE = [MQ, MQ + "+text"]
DECIDE_SHARES = ["50%", "25%", "12.5%"]
ZAP, ZIP = "h2o:recent_share=0.125,prefill=kvzap,alloc=global", "h2o:recent_share=0.125,prefill=kvzip,alloc=global"
# KVzap with a floor under its global ranking (q05-zapf, q15-ruler-b): a candidate once its cells are all in
ZAPF = ZAP + ":0.1"
Q05 = ["full", "window", "sink", "h2o", "h2o:agg=max,score=tova", SNAP, "h2o:prefill=expect", "auto", ZAP]
# KVzap cells that ran an earlier predictor than the committed one (calib/kvzap/): the q05-ruler
# groups ran the 0.5B's first predictor (WikiText-2 alone). Read under a name of their own, so
# ZAP's rows are the committed predictor's alone (q05-zap2 on the 0.5B, q15-ruler on the 1.5B)
# and `auto`'s rows are never made from a predictor it does not load
ZAP_WIKI = "kvzap-wiki"
EARLIER = {(g, ZAP): ZAP_WIKI for g in ("q05-ruler", "q05-ruler-b", "q05-ruler-c")}
# `auto` in a group pinned before the model's rows were made ran other rows (on the 0.5B the
# default rows of a model without its own): once the model has rows, those cells are a policy of
# their own, and `auto`'s rows in the rankings are its auto group's alone (the 1.5B's groups ran
# its current KL row, so theirs stay `auto` until the 1.5B's rows are made from its rankings)
AUTO_PINNED = "auto-pinned"
EARLIER.update({(g, "auto"): AUTO_PINNED for g in ("q05-ruler", "q05-ruler-b", "q05-ruler-c", "q05-cwe")})
Q05_WIKI = [ZAP_WIKI if p == ZAP else AUTO_PINNED if p == "auto" else p for p in Q05]
Q05_PINNED = [AUTO_PINNED if p == "auto" else p for p in Q05]
# q05-cwe and q15-ruler-b hold cwe's 50 items (cwe has no depths: the other groups' cwe holds ten,
# the first ten of the 50), so theirs come before the others'.
# the auto groups (q05-auto2, q15-auto) run `auto` again once the model's rows are made from the
# others: their cells come first, the others' `auto` cells ran the rows of their pinned commit;
# q05-auto3 runs niah_multiquery again once the 0.5B's context rows came from its rankings
DECIDE = {
    "Qwen2.5-Coder-0.5B": {"q05-auto3": ["auto"], "q05-auto2": ["auto"], "q05-cwe": Q05_PINNED + [ZIP], "q05-zap2": [ZAP], "q05-zapf": [ZAPF], "q05-ruler": Q05_WIKI,
                           "q05-ruler-b": Q05_WIKI, "q05-ruler-c": Q05_WIKI + [ZIP], "q05-zip": [ZIP]},
    "Qwen2.5-Coder-1.5B": {"q15-auto": ["auto"], "q15-ruler": Q05 + [ZIP], "q15-ruler-b": Q05 + [ZIP]},
}
# cells shown beside DECIDE's that are not (yet) candidates of auto's rows: KVzap with its floor
# until its cells are all in (scripts/auto_table.py reads DECIDE alone)
WATCH = {"Qwen2.5-Coder-0.5B": {}, "Qwen2.5-Coder-1.5B": {"q15-ruler-b": [ZAPF]}}
SHOWN = {model: {g: groups.get(g, []) + WATCH[model].get(g, []) for g in [*groups, *WATCH[model]]}
         for model, groups in DECIDE.items()}
# each model's key in auto's table (crates/cache/src/policy/auto_table.json)
AUTO_KEYS = {"Qwen2.5-Coder-0.5B": "qwen2:24x896", "Qwen2.5-Coder-1.5B": "qwen2:28x1536"}
# the other rankings (issue #49): title, groups, {kind: tasks}, the per-item metric
DECIDE_MORE = [
    ("Qwen2.5-Coder-0.5B at 8,192 tokens", {"q05-r8k": Q05 + [ZIP]}, KINDS, "acc"),
    ("Qwen2.5-Coder-0.5B, code completion (LCC, all 117 items), edit similarity",
     {"q05-lcc": Q05 + [ZIP]}, {"code": ["lcc"]}, "edit_sim"),
    ("Qwen2.5-Coder-0.5B, code completion (LCC, all 117 items), exact match",
     {"q05-lcc": Q05 + [ZIP]}, {"code": ["lcc"]}, "exact"),
]
# prefill costs more than 1.3x the full cache's (docs/contexts.md: the probe ~2.5x at 4K)
DEAR = {ZIP}
NAMES.update({ZAP: "KVzap-style (contexts)", ZIP: "KVzip-style (contexts)", ZAPF: "KVzap-style, floor 0.1",
              ZAP_WIKI: "KVzap-style (contexts), first predictor (WikiText-2 alone)",
              AUTO_PINNED: "auto, the default rows (pinned before the 0.5B's own)"})
# the policy string a relabelled row ran
RAN = {ZAP_WIKI: ZAP, AUTO_PINNED: "auto"}
BOOTSTRAP = 2000



def task_name(label):
    """A row's task: its name, with `+text` for a real-text haystack
    (`haystack=text`), so noise and text cells of a task never merge."""
    name = label.split(":", 1)[0]
    return name + "+text" if "haystack=text" in label else name

def load(root, groups=None):
    """{(group, task, policy, share): row} (the full cache's share is "-") and notes on what was skipped."""
    cells, notes = {}, []
    for group in groups or GROUPS:
        for path in sorted((Path(root) / "docs" / "qwen" / group).glob("shard-*/results.jsonl")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                try:
                    row = json.loads(line)
                    policy = EARLIER.get((group, row["policy"]), row["policy"])
                    if not isinstance(row["metrics"], dict) or not isinstance(row.get("per_item", {}), dict):
                        raise ValueError("metrics and per_item are objects")
                    key = (group, task_name(row["task"]), policy, "-" if policy == "full" else row["budget"])
                except (ValueError, KeyError, TypeError, AttributeError):
                    if line.strip():
                        notes.append(f"{path.relative_to(root)}:{number}: not a result row, skipped")
                    continue
                old = cells.get(key)
                if old is None:
                    cells[key] = row
                elif old is not False and [old.get(k) for k in ("git_commit", "items", "per_item")] != [
                    row.get(k) for k in ("git_commit", "items", "per_item")
                ]:
                    cells[key] = False  # two different cells under one key: show neither
                    notes.append(f"{group} {' '.join(key[1:])}: two different copies, left out")
    return {k: v for k, v in cells.items() if v}, notes


def source(policy, task):
    """The group a policy's cells of a task are shown from."""
    return next((g for g, (ps, ts, _) in GROUPS.items() if policy in ps and task in ts), None)


def rows_of(cells, tasks):
    """(policy) rows for the tasks: full, then each group's policies in order, then any others found."""
    seen = [p for g, (ps, ts, _) in GROUPS.items() for p in ps if set(ts) & set(tasks)]
    seen += sorted({k[2] for k in cells if k[1] in tasks} - set(seen))
    return list(dict.fromkeys(seen))


def metric(cells, group, task, policy, share, name):
    row = cells.get((group, task, policy, "-" if policy == "full" else share))
    v = row["metrics"].get(name) if row else None
    return float(v) if isinstance(v, (int, float)) else None


def value(cells, task, policy, share, name):
    """(policy's value, its group's full value) for the task at the share."""
    g = source(policy, task) or next((k[0] for k in cells if k[1:3] == (task, policy)), None)
    return metric(cells, g, task, policy, share, name), metric(cells, g, task, "full", share, name)


def label(policy):
    ran = RAN.get(policy, policy)
    return f"{NAMES[policy]} `{ran}`" if policy in NAMES else f"`{ran}`"


def signed(x):
    return f"{x:+.2f}".replace("-", "−")


def cell(v, f, digits=2):
    """'0.50 (50%)': a value and its % of the full cache's (none given or 0: the value alone); '–': not measured."""
    if v is None:
        return DASH
    return f"{v:.{digits}f}" + (f" ({100 * v / f:.0f}%)" if f else "")


def ruler_average(cells, policy, share):
    """(mean, full's mean, tasks) over the RULER tasks measured for both the policy and full."""
    pairs = [value(cells, t, policy, share, "acc") for t in RULER]
    pairs = [(v, f) for v, f in pairs if v is not None and f is not None]
    if not pairs:
        return None, None, 0
    return sum(v for v, _ in pairs) / len(pairs), sum(f for _, f in pairs) / len(pairs), len(pairs)


def average_cell(cells, policy, share):
    mean, full, n = ruler_average(cells, policy, share)
    if not n:
        return DASH
    mark = "" if n == len(RULER) else f" [{n}/{len(RULER)}]"
    return cell(mean, None if policy == "full" else full) + mark


def share_header():
    """Kept shares with kvpress's compression ratio (1 − kept share) beside them."""
    cols = [f"{s} kept (ratio {1 - float(s[:-1]) / 100:g})" for s in SHARES]
    return "| policy | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(SHARES)


def coverage(cells):
    tasks = RULER + [MQ, LCC]
    out = ["| group | commit | " + " | ".join(tasks) + " |", "|---|---|" + "---:|" * len(tasks)]
    for g, (ps, ts, shares) in GROUPS.items():
        want = 1 + (len(ps) - 1) * len(shares)  # the full cache runs once per task
        done = [f"{sum(k[:2] == (g, t) for k in cells)}/{want}" if t in ts else "" for t in tasks]
        commits = sorted({str(r.get("git_commit") or "?")[:7] for k, r in cells.items() if k[0] == g}) or [DASH]
        out.append(f"| {g} | {', '.join(commits)} | " + " | ".join(done) + " |")
    return "\n".join(out)


def average_table(cells):
    out = [share_header()]
    for p in rows_of(cells, RULER):
        out.append(f"| {label(p)} | " + " | ".join(average_cell(cells, p, s) for s in SHARES) + " |")
    return "\n".join(out)


def task_table(cells):
    out = ["| policy | " + " | ".join(RULER) + " |", "|---|" + "---:|" * len(RULER)]
    for p in rows_of(cells, RULER):
        vals = []
        for t in RULER:
            got = [value(cells, t, p, s, "acc")[0] for s in (SHARES[:1] if p == "full" else SHARES)]
            vals.append(DASH if all(v is None for v in got) else " / ".join(DASH if v is None else fmt(v) for v in got))
        out.append(f"| {label(p)} | " + " | ".join(vals) + " |")
    return "\n".join(out)


def metric_table(cells, task, name, digits):
    out = [share_header()]
    for p in rows_of(cells, [task]):
        vals = [value(cells, task, p, s, name) for s in SHARES]
        out.append(f"| {label(p)} | " + " | ".join(cell(v, None if p == "full" else f, digits) for v, f in vals) + " |")
    return "\n".join(out)


def t975(df):
    """Two-sided 97.5% quantile of Student's t (paired.rs: table to 30, then the normal 1.96)."""
    table = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
             2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
    return table[df - 1] if 1 <= df <= 30 else 1.96


def paired(policy, reference):
    """(n, mean difference, lo, hi) of policy − reference item by item, as paired.rs; None under 2 items."""
    n = len(policy)
    if n != len(reference) or n < 2:
        return None
    d = [a - b for a, b in zip(policy, reference)]
    mean = sum(d) / n
    half = t975(n - 1) * math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n)
    return n, mean, mean - half, mean + half


def best(cands, bar):
    """(measured, verdict, names at or above the bar) for the best of (name, value, full, tasks, of) candidates;
    only those covering the most tasks compete."""
    cands = [c for c in cands if c[1] is not None and c[2]]
    if not cands:
        return "not measured yet", "not measured yet", None
    most, of = max(c[3] for c in cands), cands[0][4]
    pct = {c[0]: 100 * c[1] / c[2] for c in cands if c[3] == most}
    top = max(pct.values())
    partial = f" over {most}/{of} tasks" if most < of else ""
    verdict = ("met" if top >= bar - 1e-9 else "not met") + (" (provisional)" if partial else "")
    names = ", ".join(n for n, v in pct.items() if v == top)
    return f"{names}: {top:.0f}% of full{partial}", verdict, {n for n, v in pct.items() if v >= bar - 1e-9}


def acc(row):
    return row.get("per_item", {}).get("acc", [])


def auto_versus(cells, ref, share):
    """(measured, verdict) of auto − ref over the RULER items of auto's group, paired by task and item."""
    g, a, b, tasks = source("auto", RULER[0]), [], [], 0
    for t in RULER:
        x, y = cells.get((g, t, "auto", share)), cells.get((g, t, ref, share))
        if x and y and len(acc(x)) == len(acc(y)) > 0:
            a, b, tasks = a + acc(x), b + acc(y), tasks + 1
    return judged(a, b, f" ({tasks}/{len(RULER)} tasks)")


def auto_versus_lcc(cells, ref, share, metric):
    """(measured, verdict) of auto − ref on the code-completion items of auto's lcc group, paired by item."""
    g = source("auto", LCC)
    x, y = cells.get((g, LCC, "auto", share)), cells.get((g, LCC, ref, share))
    a, b = ([r.get("per_item", {}).get(metric, []) for r in (x, y)] if x and y else ([], []))
    return judged(a, b, "") if len(a) == len(b) else ("not measured yet", "not measured yet")


def judged(a, b, note):
    """(measured, verdict) of the paired difference a − b: better / worse when its 95% interval excludes 0."""
    p = paired(a, b)
    if p is None:
        return ("not measured yet", "not measured yet") if not a else (f"{len(a)} item", "too few items")
    n, d, lo, hi = p
    verdict = "better" if lo > 0 else "worse" if hi < 0 else "within interval"
    return f"{signed(d)} [{signed(lo)}, {signed(hi)}] over {n} items{note}", verdict


def acceptance(cells):
    out = ["| check | kept | measured | bar | verdict |", "|---|---:|---|---|---|"]
    for share, bar in BARS.items():
        ruler = [(NAMES.get(p, p), *ruler_average(cells, p, share), len(RULER)) for p in rows_of(cells, RULER) if p != "full"]
        code = [(NAMES.get(p, p), *value(cells, LCC, p, share, "edit_sim"), 1, 1) for p in rows_of(cells, [LCC]) if p != "full"]
        passing = []
        for what, cands in (("best RULER-4K average", ruler), ("best code-completion edit similarity", code)):
            measured, verdict, ok = best(cands, bar)
            passing.append(ok)
            out.append(f"| {what} | {share} | {measured} | ≥ {bar}% of full | {verdict} |")
        both = "not measured yet" if None in passing else ", ".join(c[0] for c in ruler if c[0] in passing[0] & passing[1]) or "none"
        out.append(f"| one policy meeting both | {share} | {both} | both of the above | {'met' if both not in ('none', 'not measured yet') else both} |")
    for ref in ("h2o", SNAP):
        for share in SHARES:
            measured, verdict = auto_versus(cells, ref, share)
            out.append(f"| `auto` − {NAMES[ref]} `{ref}`, RULER-4K items, paired | {share} | {measured} | better / worse: the 95% interval excludes 0 | {verdict} |")
    for metric, what in (("edit_sim", "edit similarity"), ("exact", "exact match")):
        for ref in ("h2o", SNAP):
            for share in SHARES:
                measured, verdict = auto_versus_lcc(cells, ref, share, metric)
                out.append(f"| `auto` − {NAMES[ref]} `{ref}`, code completion {what}, paired | {share} | {measured} | better / worse: the 95% interval excludes 0 | {verdict} |")
    return "\n".join(out)


def decide_row(cells, groups, task, policy, share, metric="acc"):
    """A policy's cell of a task from the first of `groups` that has it with per-item `metric`."""
    for g in groups:
        row = cells.get((g, task, policy, "-" if policy == "full" else share))
        if row and row.get("per_item", {}).get(metric):
            return row
    return None


def decide_cells(cells, groups, task, policy, share, metric="acc"):
    """The per-item values of `metric` (accuracy by default) of [decide_row]'s cell."""
    row = decide_row(cells, groups, task, policy, share, metric)
    return row["per_item"][metric] if row else None


def stratified(pairs, seed):
    """(mean, lo, hi) over tasks of the per-task mean of a − b, with its 95% paired bootstrap
    interval: items resampled with replacement within each task, BOOTSTRAP times, percentiles
    2.5 / 97.5; `pairs`: per task, (a items, b items) of equal length."""
    import random
    rng = random.Random(seed)
    diffs = [[x - y for x, y in zip(a, b)] for a, b in pairs]
    mean = sum(sum(d) / len(d) for d in diffs) / len(diffs)
    draws = sorted(
        sum(sum(d[rng.randrange(len(d))] for _ in d) / len(d) for d in diffs) / len(diffs) for _ in range(BOOTSTRAP)
    )
    return mean, draws[int(0.025 * BOOTSTRAP)], draws[int(0.975 * BOOTSTRAP) - 1]


def task_mean(items):
    """The mean over tasks of each task's mean per-item value (`items`: per task, a list)."""
    return sum(sum(a) / len(a) for a in items) / len(items)


def decide_pairs(cells, groups, tasks, policy, ref, share, metric="acc"):
    """Per task measured for both, (policy items, reference items) paired by item index."""
    out = []
    for t in tasks:
        a, b = (decide_cells(cells, groups, t, p, share, metric) for p in (policy, ref))
        if a and b and len(a) == len(b):
            out.append((a, b))
    return out


def decide_cell(cells, groups, tasks, policy, share, metric="acc"):
    """'0.84 · −0.06 [−0.09, −0.03] · 300': the mean of `metric` over the tasks, the paired difference
    from the full cache with its bootstrap interval, the items; [k/n]: k of the n tasks so far."""
    pairs = decide_pairs(cells, groups, tasks, policy, "full", share, metric)
    if not pairs:
        return DASH
    mean = task_mean([a for a, _ in pairs])
    items = sum(len(a) for a, _ in pairs)
    mark = "" if len(pairs) == len(tasks) else f" [{len(pairs)}/{len(tasks)}]"
    if policy == "full":
        return f"{mean:.2f} · {items}{mark}"
    d, lo, hi = stratified(pairs, seed=0)
    return f"{mean:.2f} · {signed(d)} [{signed(lo)}, {signed(hi)}] · {items}{mark}"


def decide_tables(cells):
    """Per model and haystack kind: each policy's accuracy, its difference from the full cache and the
    items behind it; then `auto` against every policy of equal prefill cost over both kinds. Then
    the same for the 8K and code-completion groups."""
    sections = [(model, groups, KINDS, "acc") for model, groups in SHOWN.items()] + DECIDE_MORE
    return "\n".join(line for section in sections for line in ranking(cells, *section)).rstrip()


def ranked_policies(groups):
    """The policies of `groups`: Q05's order, KVzap with its floor, the first predictor's KVzap cells,
    the KVzip-style cells, then any others."""
    found = {p for ps in groups.values() for p in ps}
    order = Q05 + [ZAPF, ZAP_WIKI, ZIP]
    return [p for p in order if p in found] + sorted(found - set(order))


def ranking(cells, title, groups, kinds, metric):
    out = []
    policies = ranked_policies(groups)
    header = ["| policy | " + " | ".join(f"{s} kept" for s in DECIDE_SHARES) + " |", "|---|" + "---:|" * len(DECIDE_SHARES)]
    for kind, tasks in kinds.items():
        out.append(f"**{title}, {kind} haystacks** ({', '.join(tasks)}):\n" if kinds is KINDS else f"**{title}:**\n")
        out.extend(header)
        for p in policies:
            shares = DECIDE_SHARES[:1] if p == "full" else DECIDE_SHARES
            vals = [decide_cell(cells, groups, tasks, p, s, metric) for s in shares]
            out.append(f"| {label(p)} | " + " | ".join(vals + [""] * (len(DECIDE_SHARES) - len(vals))) + " |")
        out.append("")
    both = " both kinds" if len(kinds) > 1 else ""
    out.append(f"**{title}, `auto` − each policy of equal prefill cost,{both}:**\n")
    out.extend(header)
    every = [t for tasks in kinds.values() for t in tasks]
    for p in policies:
        if p in ("full", "auto") or p in DEAR:
            continue
        vals = []
        for s in DECIDE_SHARES:
            pairs = decide_pairs(cells, groups, every, "auto", p, s, metric)
            if not pairs:
                vals.append(DASH)
                continue
            d, lo, hi = stratified(pairs, seed=0)
            verdict = "better" if lo > 0 else "worse" if hi < 0 else "even"
            vals.append(f"{signed(d)} [{signed(lo)}, {signed(hi)}] {verdict} · {sum(len(a) for a, _ in pairs)}")
        out.append(f"| {label(p)} | " + " | ".join(vals) + " |")
    out.append("")
    return out


def zap_versus_zip(cells):
    """Issue #50's checks: per model, haystack and share (25%, 12.5%), the KVzap-style prefill's mean
    accuracy against the KVzip-style probe's over the same items (the RULER tasks, and compress once
    ask many), its share of it with the paired bootstrap interval of the difference; and the
    KVzip-style probe's questions answered after compression on real text at 25% kept against the
    full cache's."""
    out = ["| model | predictor | haystack | measure | kept | KVzap-style | KVzip-style | KVzap − KVzip, paired | items | KVzap / KVzip (bar 95%) |",
           "|---|---|---|---|---:|---:|---:|---|---:|---|"]
    whose = {ZAP: "committed", ZAPF: "committed, floor 0.1 (`global:0.1`)", ZAP_WIKI: "first (WikiText-2)"}
    for model, groups in SHOWN.items():
        # the committed predictor's rows, with its floor, then an earlier one's where their cells are read
        zaps = [ZAP] + [z for z in (ZAPF, ZAP_WIKI) if any(z in ps for ps in groups.values())]
        for zap, kind in ((z, k) for z in zaps for k in KINDS):
            tasks = KINDS[kind]
            who = whose[zap]
            for what, ts in (("RULER average", [t for t in tasks if not t.startswith(MQ)]),
                             ("compress once, all four answered", [t for t in tasks if t.startswith(MQ)])):
                for share in ("25%", "12.5%"):
                    pairs = decide_pairs(cells, groups, ts, zap, ZIP, share)
                    if not pairs:
                        out.append(f"| {model} | {who} | {kind} | {what} | {share} | {DASH} | {DASH} | not measured yet | 0 | not measured yet |")
                        continue
                    zap_mean, zip_ = task_mean([a for a, _ in pairs]), task_mean([b for _, b in pairs])
                    d, lo, hi = stratified(pairs, seed=0)
                    partial = "" if len(pairs) == len(ts) else f" (provisional: {len(pairs)}/{len(ts)} tasks)"
                    ratio = 100 * zap_mean / zip_ if zip_ else None
                    verdict = DASH if ratio is None else f"{ratio:.0f}%: {'met' if ratio >= 95 - 1e-9 else 'not met'}{partial}"
                    items = sum(len(a) for a, _ in pairs)
                    out.append(f"| {model} | {who} | {kind} | {what} | {share} | {zap_mean:.2f} | {zip_:.2f} | {signed(d)} [{signed(lo)}, {signed(hi)}] | {items} | {verdict} |")
    out += ["", "| model | KVzip-style questions answered, real text, 25% kept | full cache's | share of full (bar 90%) |", "|---|---:|---:|---|"]
    for model, groups in DECIDE.items():
        z, f = (decide_row(cells, groups, MQ + "+text", p, "25%") for p in (ZIP, "full"))
        if not (z and f) or not f["metrics"].get("recall"):
            out.append(f"| {model} | {DASH} | {DASH} | not measured yet |")
            continue
        zr, fr = z["metrics"]["recall"], f["metrics"]["recall"]
        out.append(f"| {model} | {zr:.3f} ({z['items']} contexts) | {fr:.3f} | {100 * zr / fr:.0f}%: {'met' if zr >= 0.9 * fr - 1e-9 else 'not met'} |")
    return "\n".join(out)


def auto_rows(root, model, use="reply"):
    """The rows of `model` of one use ("reply", or "context": a compressed context's) in auto's
    table: (share, family or None, why)."""
    path = Path(root) / "crates" / "cache" / "src" / "policy" / "auto_table.json"
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"] if path.exists() else []
    return [(r["share"], r.get("family"), r["why"]) for r in rows if r["model"] == AUTO_KEYS[model] and r["use"] == use]


def nearest_row(rows, share):
    """The row `auto` resolves to at `share` (the nearest share, a tie to the larger, as
    crates/cache/src/policy/auto.rs chooses)."""
    return min(rows, key=lambda r: (abs(r[0] - float(share[:-1])), -r[0]))


def auto_as_its_rows(cells, root):
    """Per model and share, the rows `auto` resolves to (a reply's; niah_multiquery compresses
    once and asks after, so there a context's) and how many of auto's items in the rankings have
    the same result as those rows' families' cells: all of them once auto's cells ran those rows."""
    out = ["| model | kept | `auto`'s row | items with the family's result | verdict |", "|---|---:|---|---:|---|"]
    tasks = [t for t in KINDS["noise"] + KINDS["text"] if t not in COMPRESS_ONCE]
    for model, groups in DECIDE.items():
        rows, context = auto_rows(root, model), auto_rows(root, model, "context")
        for share in DECIDE_SHARES:
            if not rows:
                out.append(f"| {model} | {share} | none of its own yet: the default rows | {DASH} | {DASH} |")
                continue
            got, family, why = nearest_row(rows, share)
            if family is None:
                out.append(f"| {model} | {share} | {got:g}%: {why} | {DASH} | not a measured family |")
                continue
            said = f"{got:g}%: `{family}`"
            uses = [(tasks, family)]
            if context:
                c_got, c_family, _ = nearest_row(context, share)
                if c_family:
                    uses.append((COMPRESS_ONCE, c_family))
                    said += f"; compressed once ({MQ}): {c_got:g}%: `{c_family}`"
            same = total = 0
            for ts, fam in uses:
                for a, b in decide_pairs(cells, groups, ts, "auto", fam, share):
                    same, total = same + sum(x == y for x, y in zip(a, b)), total + len(a)
            verdict = "not measured yet" if not total else "the same" if same == total else "differs: rerun auto's group"
            count = f"{same} / {total}" if total else DASH
            out.append(f"| {model} | {share} | {said} | {count} | {verdict} |")
    return "\n".join(out)


def headline(cells):
    """README's table: per policy, model and haystack kind, the mean accuracy over the kind's tasks at
    50 / 25 / 12.5% kept, ↓ where the paired bootstrap interval against the full cache lies below 0,
    and the items behind each share ([k/n]: k of the n tasks so far)."""
    columns = [(model, groups, kind, tasks) for model, groups in SHOWN.items() for kind, tasks in KINDS.items()]
    heads = [f"{model.removeprefix('Qwen2.5-Coder-')} {'real text' if kind == 'text' else kind}" for model, _, kind, _ in columns]
    out = ["| policy | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(columns)]
    policies = list(dict.fromkeys(p for groups in SHOWN.values() for p in ranked_policies(groups)))
    for p in policies:
        vals = []
        for _, groups, _, tasks in columns:
            shares = DECIDE_SHARES[:1] if p == "full" else DECIDE_SHARES
            got = [decide_pairs(cells, groups, tasks, p, "full", s) for s in shares]
            if not any(got):
                vals.append(DASH)
                continue
            figures = []
            for pairs in got:
                if not pairs:
                    figures.append(DASH)
                    continue
                mean = task_mean([a for a, _ in pairs])
                worse = p != "full" and stratified(pairs, seed=0)[2] < 0
                figures.append(f"{mean:.2f}" + ("↓" if worse else ""))
            items = [sum(len(a) for a, _ in pairs) for pairs in got]
            done = max(len(pairs) for pairs in got)
            mark = "" if done == len(tasks) else f" [{done}/{len(tasks)}]"
            count = str(items[0]) if len(set(items)) == 1 else "/".join(map(str, items))
            vals.append(" / ".join(figures) + f" · {count}{mark}")
        out.append(f"| {label(p)} | " + " | ".join(vals) + " |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the repository (docs/qwen/GROUP/shard-*/)")
    ap.add_argument("--summary", action="store_true", help="only the README's table (the rankings' accuracies per model and haystack)")
    ap.add_argument("--write", action="store_true",
                    help="rewrite the generated parts of docs/qwen/results.md and README.md in place instead of printing")
    ap.add_argument("--results", help="read the shards from this copy of the repository instead (default: ROOT); "
                    "scripts/qwen_matrix.sh record gives it the committed journals while the lanes append")
    args = ap.parse_args(argv)
    journals = args.results or args.root
    # the 1.5B matrix's groups and the rankings' groups are read apart, so no table mixes models
    cells, notes = load(journals)
    ranked = [*SHOWN.values()] + [groups for _, groups, _, _ in DECIDE_MORE]
    decided, more = load(journals, list(dict.fromkeys(g for groups in ranked for g in groups)))
    if args.write:
        write_docs(Path(args.root), full_report(cells, decided, notes + more, args.root), headline(decided))
        return
    if args.summary:
        print(headline(decided))
        return
    print(full_report(cells, decided, notes + more, args.root))


def write_docs(root, report, summary):
    """docs/qwen/results.md: everything after its marker; README.md: the
    table right after its marker (the prose around it stays)."""
    results = root / "docs" / "qwen" / "results.md"
    text = results.read_text()
    marker = "<!-- generated: python3 scripts/qwen_tables.py -->\n"
    results.write_text(text[: text.index(marker) + len(marker)] + "\n" + report + "\n")
    readme = root / "README.md"
    lines = readme.read_text().split("\n")
    at = lines.index("<!-- generated: python3 scripts/qwen_tables.py --summary -->") + 2
    end = at
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    readme.write_text("\n".join(lines[:at] + summary.split("\n") + lines[end:]))


def full_report(cells, decided, notes, root):
    sections = [
        ("Coverage", "Finished / expected cells per group and task (empty: not in the group), and the commit the cells ran at.", coverage(cells)),
        ("RULER-4K average", f"Mean accuracy over the six RULER tasks at 4,096 tokens ({', '.join(RULER)}), in brackets % of the full cache's mean over the same tasks "
         "(each row against its own group's full cache: r4k's is the first row); "
         "[n/6]: only n tasks measured for both the policy and full so far; ratio: kvpress's compression ratio (1 − kept share); –: not measured yet.", average_table(cells)),
        ("Per task", "Accuracy at 75 / 50 / 25 / 12.5% kept (the full cache: one value); –: not measured yet.", task_table(cells)),
        ("Compress once, ask many", f"{MQ}: the context is compressed before four questions are asked one at a time; share of the questions answered (% of full).", metric_table(cells, MQ, "recall", 2)),
        ("Code completion: edit similarity", "lcc (group lcc-a, 39 items of ~2K tokens): edit similarity of the first generated line (% of full).", metric_table(cells, LCC, "edit_sim", 3)),
        ("Code completion: exact match", "The same cells' exact match of the first line (% of full).", metric_table(cells, LCC, "exact", 3)),
        ("Rankings that decide (issue #49)", "50 items per task at 4,096 tokens, every needle task in the noise and the real-text haystack; each cell: mean accuracy over the kind's tasks (an item counts when every expected answer is in the output; niah_multiquery's four questions all answered) · its difference from the full cache, paired by task and item, with the 95% bootstrap interval (items resampled within each task, 2,000 draws, seed 0) · the items; [k/n]: k of the n tasks measured so far; –: not measured yet. Groups: q05-ruler, q05-ruler-b, q05-ruler-c, q05-zip, q05-zap2 and q05-cwe (0.5B; q05-ruler's KVzap cells ran the first predictor; cwe's 50 items from q05-cwe), q05-zapf (KVzap with its floor), q05-auto2 and q05-auto3 (`auto` alone, at the commits of the 0.5B's rows), q15-ruler and q15-ruler-b (1.5B; cwe's 50 items in q15-ruler-b); at 8K q05-r8k (ten items per task); code completion q05-lcc (edit similarity and exact match of the first line); `scripts/qwen_matrix.sh`.", decide_tables(decided)),
        ("KVzap against KVzip (issue #50)", "The KVzap-style prefill (KVzip's scores learned, in the one prefill) against the KVzip-style probe, both as contexts run them (`recent_share=0.125`, `alloc=global`), over the items of the rankings above where both ran, paired by task and item (the bootstrap as above); the bar: KVzap keeps at least 95% of KVzip's mean. Below: the probe's share of the questions answered after compression (niah_multiquery on real text, four questions per context) against the full cache's; the bar 90%.", zap_versus_zip(decided)),
        ("`auto` as its rows", "The rows of auto's table (`crates/cache/src/policy/auto_table.json`, made by `scripts/auto_table.py` from the rankings above) that `auto` resolves to per model and share (a reply's rows; on niah_multiquery, compressed once and asked after, a context's); a row naming a budget family gives B slots exactly as the evaluation ran that family, so auto's cells, once run at a commit with these rows (groups q05-auto3, q05-auto2, q15-auto, first in the rankings), have the family's result item for item.", auto_as_its_rows(decided, root)),
        ("Acceptance (issue #34)", "Best: over the rows above, among those covering the most tasks; `auto` − H2O / SnapKV: all three from r4k-auto, and from lcc-a for code completion (one build, the same items), paired: mean per-item accuracy difference with its 95% t-interval (as crates/eval/src/paired.rs).", acceptance(cells)),
    ]
    if notes:
        sections.append(("Notes", "Rows skipped while reading the shards:", "\n".join(f"- {n}" for n in notes)))
    return "\n\n".join(f"## {title}\n\n{legend}\n\n{body}" for title, legend, body in sections)


if __name__ == "__main__":
    main()
