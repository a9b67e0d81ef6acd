#!/usr/bin/env python3
"""Pivot a merged whole-set results.md into the policy × budget tables of docs/results.md.

`kvslim eval merge` writes one table per task and metric (policy rows × budget columns).
docs/results.md compares policies across tasks, so this prints, from those tables and
without recomputing anything:

  1. accuracy − full with its paired 95% interval: one row per policy × budget, one column
     per task (`*` where the interval excludes 0), below a row with the full cache's
     accuracy ± standard error;
  2. the same for acc_norm;
  3. WikiText-2: perplexity, KL(full ‖ policy) and per-window NLL − full with its interval.

With --summary it prints instead the README's compact table: the full cache's accuracy,
each policy's accuracy − full in points (`*` where the paired interval excludes 0) and the
WikiText-2 perplexity (KL) in one row per policy × budget.

Usage: scripts/whole_tables.py [--summary] [docs/whole/merged/results.md]   (a partial merge
works too: unfinished cells stay empty)
"""
import argparse
import re

TASKS = [
    ("copa", "COPA"),
    ("piqa_llmfoundry", "PIQA"),
    ("arc_easy", "ARC-Easy"),
    ("arc_challenge", "ARC-Challenge"),
    ("boolq", "BoolQ"),
    ("hellaswag_val_full", "HellaSwag"),
]
POLICIES = ["window", "sink", "heavy", "random", "h2o"]
HEADING = re.compile(r"^## (\S+) — (.+?) \(.*, (\d+) items\)$")


def parse(path):
    """{(task file stem, metric heading): {policy: {budget: cell text}}} plus item counts."""
    tables, items, key, header = {}, {}, None, None
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        m = HEADING.match(line)
        if m:
            stem = re.split(r"[.:,]", m.group(1).split(":", 1)[1])[0]
            key, header = (stem, m.group(2)), None
            items[stem] = int(m.group(3))
            tables[key] = {}
            continue
        if key is None or not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells[1:]
            continue
        tables[key][cells[0]] = dict(zip(header, cells[1:]))
    return tables, items


def nice(cell):
    return cell.replace("-", "−") if cell else ""


def budgets_of(tables):
    seen = []
    for rows in tables.values():
        for row in rows.values():
            for b in row:
                if b not in seen and b.endswith("%"):
                    seen.append(b)
    return sorted(seen, key=lambda b: -float(b[:-1]))


def full_cell(tables, stem, metric):
    """The full cache's cell of a task's metric table (the same in every budget column)."""
    return next(iter(tables[(stem, metric)].get("full", {}).values()), "")


def diff_cell(tables, stem, metric, policy, budget):
    """The policy's paired difference from the full cache, as the merge printed it."""
    return tables.get((stem, f"{metric} − full, paired 95% CI"), {}).get(policy, {}).get(budget, "")


def accuracy_table(tables, items, metric, budgets):
    cols = [(stem, name) for stem, name in TASKS if (stem, metric) in tables]
    out = ["| policy | budget | " + " | ".join(f"{name} ({items[stem]:,})" for stem, name in cols) + " |"]
    out.append("|---|---:|" + "---:|" * len(cols))
    out.append("| full | — | " + " | ".join(full_cell(tables, stem, metric) for stem, _ in cols) + " |")
    for policy in POLICIES:
        for b in budgets:
            diffs = [diff_cell(tables, stem, metric, policy, b) for stem, _ in cols]
            if any(diffs):
                out.append(f"| {policy} | {b} | " + " | ".join(nice(d) for d in diffs) + " |")
    return "\n".join(out)


def ppl_table(tables, budgets):
    ppl, kl = tables.get(("wiki", "ppl"), {}), tables.get(("wiki", "kl"), {})
    nll = tables.get(("wiki", "nll − full, paired 95% CI"), {})
    full = next(iter(ppl.get("full", {}).values()), "")
    out = [f"| policy | budget | perplexity (full {full}) | KL(full ‖ policy) | NLL − full [95% CI] |", "|---|---:|---:|---:|---:|"]
    for policy in POLICIES:
        for b in budgets:
            p = ppl.get(policy, {}).get(b, "")
            if p:
                out.append(f"| {policy} | {b} | {p} | {kl.get(policy, {}).get(b, '')} | {nice(nll.get(policy, {}).get(b, ''))} |")
    return "\n".join(out)


def points(cell):
    """'-0.1000 [-0.1985, -0.0015] *' -> '−10.0 *' (accuracy difference in points)."""
    if not cell:
        return ""
    value = float(cell.split()[0]) * 100
    return nice(f"{value:+.1f}" + (" *" if cell.rstrip().endswith("*") else ""))


def summary_table(tables, budgets):
    cols = [(stem, name) for stem, name in TASKS if (stem, "acc") in tables]
    ppl, kl = tables.get(("wiki", "ppl"), {}), tables.get(("wiki", "kl"), {})
    out = ["| policy | budget | " + " | ".join(name for _, name in cols) + " | WikiText-2 ppl (KL) |"]
    out.append("|---|---:|" + "---:|" * (len(cols) + 1))
    full = [full_cell(tables, stem, "acc").split(" ±")[0] for stem, _ in cols]
    out.append("| full | — | " + " | ".join(full) + f" | {next(iter(ppl.get('full', {}).values()), '')} |")
    for policy in POLICIES:
        for b in budgets:
            diffs = [diff_cell(tables, stem, "acc", policy, b) for stem, _ in cols]
            p = ppl.get(policy, {}).get(b, "")
            if any(diffs) or p:
                wiki = f"{p} ({kl.get(policy, {}).get(b, '')})" if p else ""
                out.append(f"| {policy} | {b} | " + " | ".join(points(d) for d in diffs) + f" | {wiki} |")
    return "\n".join(out)


def main(argv):
    parser = argparse.ArgumentParser(description="Pivot a merged whole-set results.md into policy × budget tables.")
    parser.add_argument("results", nargs="?", default="docs/whole/merged/results.md", help="results.md from `kvslim eval merge`")
    parser.add_argument("--summary", action="store_true", help="print the README's compact table instead")
    args = parser.parse_args(argv)
    tables, items = parse(args.results)
    budgets = budgets_of(tables)
    if args.summary:
        print(summary_table(tables, budgets))
        return
    print("Accuracy − full, paired 95% interval (`*`: excludes 0); first row: the full cache's accuracy ± s.e.\n")
    print(accuracy_table(tables, items, "acc", budgets))
    print("\nacc_norm − full, paired 95% interval; first row: the full cache's acc_norm\n")
    print(accuracy_table(tables, items, "acc_norm", budgets))
    print(f"\nWikiText-2, {items.get('wiki', 0)} windows\n")
    print(ppl_table(tables, budgets))


if __name__ == "__main__":
    main(None)
