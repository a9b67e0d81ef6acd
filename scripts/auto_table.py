#!/usr/bin/env python3
"""Writes `auto`'s table (crates/cache/src/policy/auto_table.json) from the committed results.

The rule: per model and kept share, the best measured H2O variant among those whose prefill
costs at most MAX_PREFILL_COST (1.3) times the full cache's:

* `tuned` sources: the spec each `kvslim tune` file chose (lowest held-out KL among tune's
  grid, which has no prompt compression); with `needles` (the model's own needle tasks, a
  result file), the row carries the prompt prefill (`prefill=`, or none) with the best mean
  accuracy there, in % of the full cache's over every task and share, among `h2o` and
  `h2o:prefill=M` that the winner's score can carry;
* `kl+needles` sources: per share of the KL file, the lowest mean KL(full||policy) among its
  rows that are plain H2O variants (keys heavy, recent, sink, score, prefill; not `auto`
  itself); the row then carries the prompt prefill (`prefill=`) with the best RULER-4K
  average, in % of the full cache's and averaged over the kept shares, among `h2o` and
  `h2o:prefill=M` in the Qwen matrix (scripts/qwen_tables.py's groups) that the winner's
  score can carry;
* `ruler` sources: per kept share of the model's groups in scripts/qwen_tables.py's "Rankings
  that decide" (50 items per task, noise and real-text haystacks), the best mean accuracy over
  every task of both kinds among the H2O variants within the prefill bound, which may name
  alloc=global, recent_share= and a KVzap predictor (as a context row); no rows until every
  candidate has every task at MIN_ITEMS items or more: until then the source's `until` rule
  makes the model's rows, or, without one, the model keeps the defaults;
* `ruler-default` (the default reply rows, for unknown models): per share of the rankings that
  decide, the best mean over the named models whose `ruler` candidates are complete, among the
  candidates that need no per-model file; while none is complete, its `until` rule:
* `agree` sources: the shares where the named models' rows agree (score, sinks, heavy
  fraction, prefill), with those values;
* `ruler-contexts` sources (rows of use "context", for compressed contexts): per kept share of
  the model's rankings that decide, the most compress-once questions answered (niah_multiquery:
  four questions asked after compression; its recall, the mean of the noise and the real-text
  cell) among the same candidates as `ruler`'s; no rows until every candidate has both cells at
  MIN_ITEMS contexts or more: until then the `contexts` rule over the source's file;
* `contexts`: per share of the file, the most compress-once questions answered among H2O
  variants within the prefill bound, which may name alloc=global, recent_share= and a KVzap
  predictor (prefill=kvzap: a model without its file falls back to the default context rows);
* `contexts-default` (the default context rows): per share, the best mean recall over the
  named models' context files among the candidates that need no per-model file.

A row's heavy fraction is the winner's heavy / (heavy + recent) slots, kept as the two
integers so the Rust side divides exactly as before; H2O without heavy=/recent= splits the
non-sink slots in half. A row whose winner is an evaluation's budget family (`ruler`,
`ruler-default`, `ruler-contexts`, `contexts`, `contexts-default`) also names it (`family`): `auto` then gives B
slots exactly as the evaluation did, so its cells are the winner's. SOURCES and PREFILL_COST are the only
hand-written inputs.

Usage: python3 scripts/auto_table.py [--root DIR] [--check]
  (--check: exit 1 when the committed table is not what the results give; scripts/check_docs.py runs it)
"""
import argparse
import difflib
import json
import sys
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen_tables  # noqa: E402  (the Qwen matrix's cells and RULER-4K averages)

TABLE = "crates/cache/src/policy/auto_table.json"
COMMAND = "python3 scripts/auto_table.py"
MAX_PREFILL_COST = 1.3
# items per task a `ruler` source needs for every task and candidate before it makes rows
MIN_ITEMS = 50
# Time to the first token, × the full cache's, per prefill mode: docs/qwen.md "What it costs"
# (3,742 prompt tokens: full 35.4 s, snap:32 39.1 s); kvzip (the probe in pieces) and kvzap from
# docs/contexts.md "At 16K, and on the 1.5B" (3,354 tokens on the 1.5B: full 19.4 s, kvzip 41.2 s,
# kvzap 20.1 s). The result files carry no per-policy prefill time (the matrix's timings are per
# shared cell); expect and rkv score the prompt in its one pass (crates/cache/src/policy/token.rs,
# Observation) and were not timed.
PREFILL_COST = {None: 1.0, "snap": 39.1 / 35.4, "kvzip": 41.2 / 19.4, "expect": 1.0, "rkv": 1.0, "kvzap": 20.1 / 19.4}
# The keys a context row can say (a reply's rows: parse's default).
CONTEXT_KEYS = ("heavy", "recent", "recent_share", "sink", "score", "prefill", "alloc")
# The scores each prefill mode can rank by (the grammar's refusals, crates/cache/src/policy/spec/family.rs).
PREFILL_SCORES = {"snap": {"sum", "norm", "vnorm"}, "expect": {"sum", "norm"}, "kvzip": {"sum", "norm"}, "rkv": {"sum", "norm"}}
# Which results each model's rows come from, its key (crates/cache/src/policy/auto.rs, model_key) and name.
SOURCES = [
    {"model": "llama:30x576", "name": "SmolLM2-135M", "rule": "tuned", "files": "docs/tuned/smollm2-*.json",
     "needles": "docs/results/default-rows/smollm2-2k/results.jsonl"},
    {"model": "gemma3:18x640", "name": "Gemma 3 270M", "rule": "tuned", "files": "docs/tuned/gemma-*.json",
     "needles": "docs/results/default-rows/gemma-2k/results.jsonl"},
    {"model": "llama:5x64", "name": "stories260K", "rule": "tuned", "files": "docs/tuned/stories260k-*.json"},
    {"model": "qwen2:28x1536", "name": "Qwen2.5-Coder-1.5B", "rule": "ruler", "decide": "Qwen2.5-Coder-1.5B",
     "until": {"rule": "kl+needles", "files": "docs/qwen/auto-kl/results.jsonl"}},
    {"model": "qwen2:24x896", "name": "Qwen2.5-Coder-0.5B", "rule": "ruler", "decide": "Qwen2.5-Coder-0.5B"},
    {"model": "*", "name": "any other model", "rule": "ruler-default", "of": ["qwen2:24x896", "qwen2:28x1536"],
     "until": {"rule": "agree", "of": ["llama:30x576", "gemma3:18x640"], "evidence": "docs/results/tuning.md"}},
    # compressed contexts: questions asked after compression (docs/contexts.md, "auto for contexts")
    {"model": "qwen2:24x896", "name": "Qwen2.5-Coder-0.5B", "use": "context", "rule": "ruler-contexts",
     "decide": "Qwen2.5-Coder-0.5B", "files": "docs/contexts/reuse-q05/results.jsonl", "until": {"rule": "contexts"}},
    {"model": "qwen2:28x1536", "name": "Qwen2.5-Coder-1.5B", "use": "context", "rule": "ruler-contexts",
     "decide": "Qwen2.5-Coder-1.5B", "files": "docs/contexts/reuse-q15/results.jsonl", "until": {"rule": "contexts"}},
    {"model": "*", "name": "any other model", "use": "context", "rule": "contexts-default",
     "of": ["qwen2:24x896", "qwen2:28x1536"]},
]


def parse(policy, keys_allowed=("heavy", "recent", "sink", "score", "prefill")):
    """A plain H2O variant's (score, sinks, heavy fraction as (n, d), prefill, alloc), else None."""
    family, _, rest = policy.partition(":")
    if family != "h2o":
        return None
    keys = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    if set(keys) - set(keys_allowed):
        return None  # agg=, alloc=: a reply's row cannot say them
    if "recent_share" in keys:
        if "heavy" in keys or "recent" in keys:
            return None
        split = Fraction(1) - Fraction(keys["recent_share"])
        split = (split.numerator, split.denominator)
    elif "heavy" in keys and "recent" in keys:
        heavy, recent = (Fraction(keys[k].rstrip("%")) for k in ("heavy", "recent"))
        share = heavy / (heavy + recent)  # slots are kept as such, shares (P%) reduced
        whole = heavy.denominator == recent.denominator == 1 and "%" not in keys["heavy"]
        split = (int(heavy), int(heavy + recent)) if whole else (share.numerator, share.denominator)
    elif "heavy" in keys or "recent" in keys:
        return None
    else:
        split = (1, 2)  # the family's own split: half heavy, half recent
    prefill = keys.get("prefill")
    prefill = None if prefill == "full" else prefill
    return keys.get("score", "sum"), int(keys.get("sink", 0)), split, prefill, keys.get("alloc")


def cost(prefill):
    return PREFILL_COST[None if prefill is None else prefill.split(":")[0]]


def row(src, share, variant, evidence, why, family=None):
    score, sinks, heavy, prefill, alloc = variant
    return {"model": src["model"], "model_name": src["name"], "use": src.get("use", "reply"), "share": share,
            "score": score, "sinks": sinks, "heavy": list(heavy), "prefill": prefill, "alloc": alloc,
            "family": family, "evidence": evidence, "why": why}


def percent(budget):
    if not budget.endswith("%"):
        raise ValueError(f"budget {budget!r}: the table is kept by share (P%)")
    return float(budget[:-1])


def tuned(root, src):
    rows = []
    for path in sorted(root.glob(src["files"])):
        d = json.loads(path.read_text(encoding="utf-8"))
        variant = parse(d["spec"]) if d.get("kind") == "kvslim-tune" else None
        if variant is None or cost(variant[3]) > MAX_PREFILL_COST or needs_predictor(variant[3]):
            raise ValueError(f"{path}: not a kvslim-tune file with a plain H2O spec within the prefill bound")
        why = f"tune's winner {d['spec']}"
        if "needles" in src and variant[3] is None:
            mode, pct = needle_prefill(root, src["needles"], variant[0])
            variant = (*variant[:3], mode, variant[4])
            why += f"; prefill={mode}: needles {pct:.1f}% of full ({src['needles']})" if mode else ""
        rows.append(row(src, percent(d["budget"]), variant, path.relative_to(root).as_posix(), why))
    return sorted(rows, key=lambda r: -r["share"])


def prefill_candidates(score, policies):
    """The policies that are plain H2O or H2O with one prefill= and nothing else, within the
    prefill bound, whose prefill can carry `score`: {policy: mode (None: no prefill)}."""
    out = {}
    for policy in policies:
        v = parse(policy)
        mode = v and v[3]
        if policy not in ("h2o", f"h2o:prefill={mode}"):
            continue
        if cost(mode) > MAX_PREFILL_COST or (mode and score not in PREFILL_SCORES[mode.split(":")[0]]):
            continue
        out[policy] = mode
    return out


def needle_prefill(root, path, score):
    """(prefill mode or None, its mean % of full) with the best mean needle accuracy in one
    evaluation's results (every task, every share) that `score` can carry; ties: the cheaper."""
    rows = [json.loads(l) for l in (root / path).read_text(encoding="utf-8").splitlines()]
    full = {r["task"]: r["metrics"]["acc"] for r in rows if r["policy"] == "full"}
    cands = []
    for policy, mode in prefill_candidates(score, {r["policy"] for r in rows}).items():
        cells = [r for r in rows if r["policy"] == policy]
        if not cells or any(not full.get(r["task"]) for r in cells):
            continue
        pct = sum(100 * r["metrics"]["acc"] / full[r["task"]] for r in cells) / len(cells)
        cands.append((pct, -cost(mode), mode or ""))
    if not cands:
        raise ValueError(f"{path}: no H2O prefill candidate with the full cache beside it")
    pct, _, mode = max(cands)
    return mode or None, pct


def best_prefill(root, score):
    """(prefill mode, its mean % of full) with the best RULER-4K average that `score` can carry."""
    cells, _ = qwen_tables.load(root)
    cands = []
    for policy, mode in sorted(prefill_candidates(score, {k[2] for k in cells}).items()):
        pct = []
        for share in qwen_tables.SHARES:
            mean, full, n = qwen_tables.ruler_average(cells, policy, share)
            if n == len(qwen_tables.RULER) and full:
                pct.append(100 * mean / full)
        if len(pct) == len(qwen_tables.SHARES):
            cands.append((sum(pct) / len(pct), -cost(mode), mode))
    if not cands:
        raise ValueError("no prefill candidate has RULER-4K averages at every share")
    top = max(cands)
    return top[2], top[0]


def kl_and_needles(root, src):
    path = root / src["files"]
    by_share = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        v = parse(r["policy"]) if r["policy"] != "auto" else None
        kl = r.get("metrics", {}).get("kl")
        if v is None or not isinstance(kl, (int, float)) or cost(v[3]) > MAX_PREFILL_COST or needs_predictor(v[3]):
            continue
        by_share.setdefault(percent(r["budget"]), []).append((kl, r["metrics"].get("nll", 0.0), r["policy"], v))
    rows = []
    for share, cands in sorted(by_share.items(), reverse=True):
        kl, _, policy, (score, sinks, heavy, prefill, alloc) = min(cands)
        why = f"lowest KL {kl:.4f} at {share:g}%: {policy}"
        if prefill is None:
            prefill, pct = best_prefill(root, score)
            why += f"; prefill={prefill}: RULER-4K {pct:.1f}% of full (docs/qwen/ matrix)"
        rows.append(row(src, share, (score, sinks, heavy, prefill, alloc), path.relative_to(root).as_posix(), why))
    return rows


def agree(rows, src):
    of = [[r for r in rows if r["model"] == m] for m in src["of"]]
    out = []
    for first in of[0]:
        same = [next((r for r in rs if r["share"] == first["share"]), None) for rs in of[1:]]
        values = lambda r: (r["score"], r["sinks"], Fraction(*r["heavy"]), r["prefill"], r["alloc"])  # noqa: E731
        if all(r is not None and values(r) == values(first) for r in same):
            v = (first["score"], first["sinks"], tuple(first["heavy"]), first["prefill"], first["alloc"])
            out.append(row(src, first["share"], v, src["evidence"], f"{' and '.join(src['of'])} agree"))
    return out


def needs_predictor(prefill):
    """Whether a prefill mode needs a per-model file (KVzap's predictor): the default rows and the
    tuned and kl+needles rows never pick one; a model's context and ruler rows may, and fall back
    to the default rows without the file."""
    return prefill is not None and prefill.split(":")[0] == "kvzap"


def recalls(root, path):
    """{(share, policy): (recall, questions)} of the compress-once task's rows of one result file
    that a context row can say (plain H2O with recent_share=, alloc=) within the prefill bound."""
    out = {}
    for line in (root / path).read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if not r["task"].startswith("niah_multiquery"):
            continue
        v = parse(r["policy"], CONTEXT_KEYS)
        if v is None or cost(v[3]) > MAX_PREFILL_COST:
            continue
        out[(percent(r["budget"]), r["policy"])] = (r["metrics"]["recall"], 4 * r["items"], v)
    return out


def best(cands):
    """The candidate (recall, -cost, policy, …) with the most recall; ties: the cheaper prefill,
    then the shorter spec, then the spec's text."""
    return max(cands, key=lambda c: (c[0], c[1], -len(c[2]), c[2]))


def contexts(root, src):
    """Per share, the most questions answered after compression ([best]), among the candidates
    of the source's file."""
    found = recalls(root, src["files"])
    rows = []
    for share in sorted({s for s, _ in found}, reverse=True):
        cands = [(rec, -cost(v[3]), policy, n, v) for (s, policy), (rec, n, v) in found.items() if s == share]
        rec, _, policy, n, v = best(cands)
        why = f"compress-once recall {100 * rec:.1f}% of {n} questions at {share:g}%: {policy}"
        rows.append(row(src, share, v, src["files"], why, policy))
    return rows


def contexts_default(root, src):
    """Per share, the best mean recall over the named models' files among candidates that need
    no per-model file."""
    files = [next(s["files"] for s in SOURCES if s["model"] == m and s.get("use") == "context") for m in src["of"]]
    each = [recalls(root, f) for f in files]
    rows = []
    for share in sorted({s for s, _ in each[0]}, reverse=True):
        cands = []
        for (s, policy), (_, _, v) in each[0].items():
            if s != share or needs_predictor(v[3]) or not all((s, policy) in e for e in each):
                continue
            mean = sum(e[(s, policy)][0] for e in each) / len(each)
            cands.append((mean, -cost(v[3]), policy, v))
        if cands:
            mean, _, policy, v = best(cands)
            why = f"mean compress-once recall {100 * mean:.1f}% over {' and '.join(src['of'])} at {share:g}%: {policy}"
            rows.append(row(src, share, v, " + ".join(files), why, policy))
    return rows


def ruler_policies(groups):
    """(policy, row values) of each H2O variant in the rankings' groups within the prefill bound
    (a KVzap predictor allowed), in the groups' order."""
    for policy in dict.fromkeys(p for ps in groups.values() for p in ps):
        v = parse(policy, CONTEXT_KEYS)
        if v is not None and cost(v[3]) <= MAX_PREFILL_COST:
            yield policy, v


def ruler_candidates(root, src):
    """{share: [(mean, -cost, policy, variant)]}: per kept share of the model's groups, each H2O
    variant within the prefill bound (a KVzap predictor allowed) with its mean RULER-4K accuracy
    over every task of both haystack kinds; None until every candidate has every task at
    MIN_ITEMS items or more."""
    groups = qwen_tables.DECIDE[src["decide"]]
    cells, _ = qwen_tables.load(root, list(groups))
    tasks = qwen_tables.KINDS["noise"] + qwen_tables.KINDS["text"]
    out = {}
    for share in qwen_tables.DECIDE_SHARES:
        out[share] = []
        for policy, v in ruler_policies(groups):
            items = [qwen_tables.decide_cells(cells, list(groups), t, policy, share) for t in tasks]
            if any(not a or len(a) < MIN_ITEMS for a in items):
                return None
            out[share].append((qwen_tables.task_mean(items), -cost(v[3]), policy, v))
    return out


def ruler_contexts(root, src):
    """Per kept share of the model's groups, the candidate ([ruler_policies]) with the most
    compress-once questions answered (niah_multiquery's recall, the mean of its noise and real-text
    cells; [best]); no rows until every candidate has both cells at MIN_ITEMS contexts or more."""
    groups = qwen_tables.DECIDE[src["decide"]]
    cells, _ = qwen_tables.load(root, list(groups))
    found = {}
    for share in qwen_tables.DECIDE_SHARES:
        found[share] = []
        for policy, v in ruler_policies(groups):
            got = [qwen_tables.decide_row(cells, groups, t, policy, share) for t in qwen_tables.COMPRESS_ONCE]
            if any(r is None or r["items"] < MIN_ITEMS or "recall" not in r["metrics"] for r in got):
                return []
            recall = sum(r["metrics"]["recall"] for r in got) / len(got)
            found[share].append((recall, -cost(v[3]), policy, sum(4 * r["items"] for r in got), v))
    rows = []
    for share, cands in found.items():
        recall, _, policy, n, v = best(cands)
        why = f"compress-once recall {100 * recall:.1f}% of {n} questions (noise and text) at {share}: {policy}"
        rows.append(row(src, percent(share), v, ruler_evidence(src), why, policy))
    return rows


def ruler_evidence(src):
    """The groups of the model's rankings that decide holding a candidate (not `auto` alone)."""
    groups = qwen_tables.DECIDE[src["decide"]]
    return "docs/qwen/" + ", ".join(g for g, ps in groups.items() if any(p != "auto" for p in ps))


def ruler_tasks():
    return len(qwen_tables.KINDS["noise"] + qwen_tables.KINDS["text"])


def ruler(root, src):
    """Per kept share, the best of [ruler_candidates] ([best]: ties go to the cheaper prefill);
    no rows until they are complete."""
    found = ruler_candidates(root, src) or {}
    rows = []
    for share, cands in found.items():
        mean, _, policy, v = best(cands)
        why = f"RULER-4K mean accuracy {100 * mean:.1f}% over {ruler_tasks()} tasks (noise and text) at {share}: {policy}"
        rows.append(row(src, percent(share), v, ruler_evidence(src), why, policy))
    return rows


def ruler_default(root, src):
    """Per kept share, the best mean over the named models' [ruler_candidates] among the
    candidates that need no per-model file, over the models whose candidates are complete; no
    rows while none is."""
    srcs = [next(s for s in SOURCES if s["model"] == m and s["rule"] == "ruler") for m in src["of"]]
    found = [(s, f) for s in srcs if (f := ruler_candidates(root, s)) is not None]
    rows = []
    for share in qwen_tables.DECIDE_SHARES if found else []:
        each = [{c[2]: c for c in f[share]} for _, f in found]
        cands = []
        for policy, (_, neg_cost, _, v) in each[0].items():
            if needs_predictor(v[3]) or not all(policy in e for e in each):
                continue
            cands.append((sum(e[policy][0] for e in each) / len(each), neg_cost, policy, v))
        mean, _, policy, v = best(cands)
        names = " and ".join(s["model"] for s, _ in found)
        why = f"mean RULER-4K accuracy {100 * mean:.1f}% over {names} at {share}: {policy}"
        rows.append(row(src, percent(share), v, " + ".join(ruler_evidence(s) for s, _ in found), why, policy))
    return rows


def table(root):
    rows = []
    for src in SOURCES:
        rule = {
            "tuned": lambda s: tuned(root, s),
            "kl+needles": lambda s: kl_and_needles(root, s),
            "ruler": lambda s: ruler(root, s),
            "ruler-default": lambda s: ruler_default(root, s),
            "agree": lambda s: agree(rows, s),
            "ruler-contexts": lambda s: ruler_contexts(root, s),
            "contexts": lambda s: contexts(root, s),
            "contexts-default": lambda s: contexts_default(root, s),
        }
        made = rule[src["rule"]](src)
        if not made and "until" in src:
            made = rule[src["until"]["rule"]]({**src, **src["until"]})
        rows += made
    head = {
        "generated": f"by `{COMMAND}` from the result files each row's evidence names; do not edit, rerun it",
        "rule": f"per model, use and kept share, the best measured H2O variant whose prefill costs at most {MAX_PREFILL_COST}x the full cache's (docs/policies.md, auto)",
    }
    lines = ["{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in head.items()) + ', "rows": [']
    lines += [" " + json.dumps(r, ensure_ascii=False) + ("," if i + 1 < len(rows) else "") for i, r in enumerate(rows)]
    return "\n".join(lines) + "\n]}\n"


def check(root):
    """None when the committed table is what the results give, else what is wrong."""
    root = Path(root)
    want, path = table(root), root / TABLE
    have = path.read_text(encoding="utf-8") if path.exists() else ""
    if have == want:
        return None
    diff = list(difflib.unified_diff(have.splitlines(), want.splitlines(), TABLE, "regenerated", lineterm="", n=0))
    return f"{TABLE} differs from what the committed results give; run `{COMMAND}`:\n" + "\n".join(diff[:12])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the repository")
    ap.add_argument("--check", action="store_true", help="compare with the committed table instead of writing it")
    a = ap.parse_args(argv)
    if a.check:
        problem = check(a.root)
        print(problem or f"{TABLE} is up to date")
        return 1 if problem else 0
    (a.root / TABLE).write_text(table(a.root), encoding="utf-8")
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
