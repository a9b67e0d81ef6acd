#!/usr/bin/env python3
"""Which answer does each policy pick on two-choice tasks, and does it still discriminate?

`kvslim eval` writes per-item correctness (`per_item.acc`, `per_item.acc_norm`), not the
chosen answer. On a two-choice task the choice follows from correctness and the gold label,
so this script recovers it and prints, per cell:

  - P(pick 1): how often the second choice wins (for BoolQ, choices are ["no", "yes"], so
    this is the "yes" rate; 62% of BoolQ validation golds are "yes");
  - J = P(pick 1 | gold 1) - P(pick 1 | gold 0) (Youden's J): 0 means the pick ignores the
    item, 1 means it is always right. An accuracy change with J near 0 is a change of bias,
    not of comprehension.

Usage: scripts/choice_bias.py [RESULTS.jsonl ...]   (default: docs/whole/*/results.jsonl)
Data files are looked up by name under ../shared/data.
"""
import glob
import json
import os
import sys

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def find_data(name):
    hits = glob.glob(os.path.join(DATA, "**", name), recursive=True)
    if not hits:
        sys.exit(f"choice_bias: data file {name!r} not found under {DATA}")
    return hits[0]


def golds_of(task):
    """Gold labels of a two-choice `mc:` task, or None when it is not one."""
    if not task.startswith("mc:"):
        return None
    name = task[3:].split(",")[0]
    items = [json.loads(line) for line in open(find_data(name))]
    if any(len(item["choices"]) != 2 for item in items):
        return None
    return [int(item["gold"]) for item in items]


def main(paths):
    paths = paths or sorted(
        p for p in glob.glob("docs/whole/*/results.jsonl") if "/partial/" not in p
    )
    cache, seen = {}, set()
    print("| task | policy | budget | metric | acc | P(pick 1) | J |")
    print("|---|---|---|---|---:|---:|---:|")
    for path in paths:
        for line in open(path):
            row = json.loads(line)
            key = (row["task"], row["policy"], row["budget"])
            if key in seen:
                continue
            if row["task"] not in cache:
                cache[row["task"]] = golds_of(row["task"])
            golds = cache[row["task"]]
            if golds is None:
                continue
            seen.add(key)
            for metric in ("acc", "acc_norm"):
                correct = row["per_item"][metric]
                if len(correct) != len(golds):
                    sys.exit(f"choice_bias: {path}: {key} has {len(correct)} items, data {len(golds)}")
                picks = [g if c == 1.0 else 1 - g for g, c in zip(golds, correct)]
                ones = [p for p, g in zip(picks, golds) if g == 1]
                zeros = [p for p, g in zip(picks, golds) if g == 0]
                j = sum(ones) / len(ones) - sum(zeros) / len(zeros)
                print(
                    f"| {row['task'][3:]} | {row['policy']} | {row['budget']} | {metric} "
                    f"| {sum(correct) / len(correct):.3f} | {sum(picks) / len(picks):.3f} | {j:+.3f} |"
                )


if __name__ == "__main__":
    main(sys.argv[1:])
