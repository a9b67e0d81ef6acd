#!/usr/bin/env python3
"""Which answer does each policy pick on multiple-choice tasks, and does it still discriminate?

Rows of `kvslim eval` record the chosen answer per item (`per_item.pick`, `pick_norm`);
rows written before that (the pinned whole-set matrix) record only correctness, and on a
two-choice task the pick follows from correctness and the gold label. Per cell and metric:

  - P(pick c): how often each choice index wins (for BoolQ, choices are ["no", "yes"], so
    P(pick 1) is the "yes" rate; 62% of BoolQ validation golds are "yes");
  - J (two-choice tasks) = P(pick 1 | gold 1) - P(pick 1 | gold 0), Youden's J: 0 means the
    pick ignores the item, 1 means it is always right. An accuracy change with J near 0 is
    a change of bias, not of comprehension.

Usage: scripts/choice_bias.py [RESULTS.jsonl ...]   (default: docs/whole/*/results.jsonl)
Data files are looked up by name under ../shared/data (only needed for the gold labels).
"""
import argparse
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


def task_items(task):
    """(gold labels, choice counts) of an `mc:` task, or None for other kinds."""
    if not task.startswith("mc:"):
        return None
    name = task[3:].split(",")[0]
    items = [json.loads(line) for line in open(find_data(name))]
    return [int(item["gold"]) for item in items], [len(item["choices"]) for item in items]


def picks_of(row, metric, golds, counts):
    recorded = row["per_item"].get({"acc": "pick", "acc_norm": "pick_norm"}[metric])
    if recorded is not None:
        return [int(p) for p in recorded]
    if any(n != 2 for n in counts):
        return None  # not recorded, and correctness alone does not say which wrong choice won
    return [g if c == 1.0 else 1 - g for g, c in zip(golds, row["per_item"][metric])]


def main(paths):
    paths = paths or sorted(
        p for p in glob.glob("docs/whole/*/results.jsonl") if "/partial/" not in p
    )
    cache, seen = {}, set()
    print("| task | policy | budget | metric | acc | P(pick c), c = 0, 1, … | J |")
    print("|---|---|---|---|---:|---|---:|")
    for path in paths:
        for line in open(path):
            row = json.loads(line)
            key = (row["task"], row["policy"], row["budget"])
            if key in seen:
                continue
            if row["task"] not in cache:
                cache[row["task"]] = task_items(row["task"])
            if cache[row["task"]] is None:
                continue
            seen.add(key)
            golds, counts = cache[row["task"]]
            golds, counts = golds[: row["items"]], counts[: row["items"]]
            for metric in ("acc", "acc_norm"):
                picks = picks_of(row, metric, golds, counts)
                if picks is None:
                    continue
                if len(picks) != len(golds):
                    sys.exit(f"choice_bias: {path}: {key} has {len(picks)} items, data {len(golds)}")
                rates = [picks.count(c) / len(picks) for c in range(max(counts))]
                j = ""
                if max(counts) == 2:
                    ones = [p for p, g in zip(picks, golds) if g == 1]
                    zeros = [p for p, g in zip(picks, golds) if g == 0]
                    j = f"{sum(ones) / len(ones) - sum(zeros) / len(zeros):+.3f}"
                acc = sum(p == g for p, g in zip(picks, golds)) / len(picks)
                print(
                    f"| {row['task'][3:]} | {row['policy']} | {row['budget']} | {metric} "
                    f"| {acc:.3f} | {', '.join(f'{r:.3f}' for r in rates)} | {j} |"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="*", help="results.jsonl files (default: docs/whole/*/results.jsonl)")
    main(parser.parse_args().results)
