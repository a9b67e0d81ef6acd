#!/usr/bin/env python3
"""Prints the needle tasks behind `auto`'s tuned rows (docs/results/tuning.md, "The tuned rows on
needle tasks"): SmolLM2-135M and Gemma 3 270M at 2,048 tokens, passkey / niah_single /
niah_multikey in the noise and real-text haystacks, 20 items per task.

The first table: per policy, model and haystack, the mean accuracy over the haystack's tasks at
50 / 25 / 12.5% kept. `auto` before is the rows as `kvslim tune` chose them (lowest held-out KL,
no prompt compression), measured in the first run (docs/results/default-rows/MODEL-2k); `auto`
now carries the prompt prefill those runs chose (scripts/auto_table.py, `needles`), measured on
the same items afterwards (MODEL-2k-auto). The second: `auto` now minus each, paired by item,
with the 95% bootstrap interval over items within tasks (scripts/qwen_tables.py, `stratified`).

Usage: python3 scripts/default_rows.py [--root DIR]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen_tables  # noqa: E402  (the paired bootstrap)

DIR = "docs/results/default-rows"
MODELS = [("smollm2", "SmolLM2-135M"), ("gemma", "Gemma 3 270M")]
SHARES = ["50%", "25%", "12.5%"]
POLICIES = [
    ("full", "full cache", "before"),
    ("h2o", "H2O", "before"),
    ("h2o:agg=max,score=tova", "TOVA", "before"),
    ("h2o:prefill=snap:32", "SnapKV", "before"),
    ("h2o:prefill=expect", "Expected Attention", "before"),
    ("auto", "`auto` before (KL rows)", "before"),
    ("auto", "`auto` now (KL rows + SnapKV's prefill)", "now"),
]


def load(root, model, run):
    """{(policy, budget, kind): {task: per-item accuracies}} of one run directory."""
    path = root / DIR / (f"{model}-2k" if run == "before" else f"{model}-2k-auto") / "results.jsonl"
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        kind = "text" if "haystack=text" in r["task"] else "noise"
        out.setdefault((r["policy"], r["budget"], kind), {})[r["task"]] = r["per_item"]["acc"]
    return out


def items(runs, model, policy, run, share, kind):
    got = runs[(model, run)].get((policy, "-" if policy == "full" else share, kind), {})
    return [got[t] for t in sorted(got)]


def tables(root):
    runs = {(m, run): load(root, m, run) for m, _ in MODELS for run in ("before", "now")}
    kinds = ["noise", "text"]
    head = [f"{name} {kind}" for _, name in MODELS for kind in kinds]
    out = ["| policy | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for policy, name, run in POLICIES:
        cells = []
        for m, _ in MODELS:
            for kind in kinds:
                means = [qwen_tables.task_mean(items(runs, m, policy, run, s, kind)) for s in SHARES]
                n = sum(len(a) for a in items(runs, m, policy, run, SHARES[0], kind))
                cells.append(f"{means[0]:.2f} · {n}" if policy == "full" else " / ".join(f"{x:.2f}" for x in means))
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", "| `auto` now minus | share | " + " | ".join(head) + " |", "|---|---|" + "---:|" * len(head)]
    for policy, name, run in POLICIES[3:6]:
        for s in SHARES:
            cells = []
            for m, _ in MODELS:
                for kind in kinds:
                    pairs = list(zip(items(runs, m, "auto", "now", s, kind), items(runs, m, policy, run, s, kind)))
                    d, lo, hi = qwen_tables.stratified(pairs, seed=0)
                    cells.append(f"{qwen_tables.signed(d)} [{qwen_tables.signed(lo)}, {qwen_tables.signed(hi)}]")
            out.append(f"| {name} | {s} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the repository")
    print(tables(ap.parse_args(argv).root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
