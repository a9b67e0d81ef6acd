#!/usr/bin/env python3
"""Tables of the RULER-style long-context suite from a merged results.jsonl.

One table for the whole suite: a row per policy × budget, a column per task
with its accuracy at each prompt length ("1 / 1 / 0.67 / 0", the lengths
named in the header), each over that length's depths; then the same by
needle depth (over every length). Cells come from the rows' `acc_len{L}` and
`acc_depth{D}` metrics, which kvslim eval writes for every long-context task.

Usage: scripts/ruler_tables.py [docs/ruler/merged/results.jsonl]
"""
import argparse
import json
import re

TASKS = ["passkey", "niah_single", "niah_multikey", "niah_multivalue", "vt", "cwe"]
POLICY_ORDER = ["full", "window", "sink", "heavy", "random", "h2o"]



def task_name(label):
    """A row's task: its name, with `+text` for a real-text haystack
    (`haystack=text`), so noise and text cells of a task never merge."""
    name = label.split(":", 1)[0]
    return name + "+text" if "haystack=text" in label else name

def load(path):
    """Rows of the long-context tasks, keyed by (task name, policy, budget)."""
    rows = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            name = task_name(row["task"])
            if name in TASKS:
                rows[(name, row["policy"], row["budget"])] = row
    return rows


def keyed(metrics, prefix):
    """{value: acc} of the metrics named prefix + value, sorted by value."""
    found = {}
    for k, v in metrics.items():
        m = re.fullmatch(re.escape(prefix) + r"([0-9.]+)", k)
        if m:
            found[float(m.group(1))] = v
    return dict(sorted(found.items()))


def fmt(x):
    return f"{x:.2f}".rstrip("0").rstrip(".") if x not in (0, 1) else str(int(x))


def cells(rows):
    """(policy, budget) in the table's order: full first, then by family and budget, largest first."""
    seen = sorted({(p, b) for (_, p, b) in rows})

    def order(pb):
        p, b = pb
        family = p.split(":", 1)[0]
        rank = POLICY_ORDER.index(family) if family in POLICY_ORDER else len(POLICY_ORDER)
        pct = float(b.rstrip("%")) if b.endswith("%") else 101.0
        return (rank, p != family, p, -pct)

    return sorted(seen, key=order)


def budget_label(b):
    return "—" if b == "-" else b


def table(rows, prefix, label, skip=()):
    tasks = [t for t in TASKS if t not in skip and any(k[0] == t for k in rows)]
    # every cell of a task has the same lengths (depths): take them from any of its rows
    points = {t: list(keyed(next(r for k, r in rows.items() if k[0] == t)["metrics"], prefix)) for t in tasks}
    head = " | ".join(f"{t} ({' / '.join(fmt(v) for v in points[t])})" for t in tasks)
    out = [f"| policy | budget | {head} |", "|---|---:|" + "---|" * len(tasks)]
    for p, b in cells(rows):
        vals = []
        for t in tasks:
            row = rows.get((t, p, b))
            vals.append(" / ".join(fmt(v) for v in keyed(row["metrics"], prefix).values()) if row else "")
        out.append(f"| {p} | {budget_label(b)} | " + " | ".join(vals) + " |")
    return f"Accuracy by {label}\n\n" + "\n".join(out)


def overall(rows):
    tasks = [t for t in TASKS if any(k[0] == t for k in rows)]
    out = ["| policy | budget | " + " | ".join(tasks) + " | mean |", "|---|---:|" + "---:|" * (len(tasks) + 1)]
    for p, b in cells(rows):
        metrics = [rows[(t, p, b)]["metrics"] if (t, p, b) in rows else None for t in tasks]
        done = [m["acc"] for m in metrics if m is not None]
        mean = f"{sum(done) / len(done):.2f}" if len(done) == len(tasks) else ""
        vals = ["" if m is None else f"{m['acc']:.2f}" + (f" ({m['recall']:.2f})" if "recall" in m else "") for m in metrics]
        out.append(f"| {p} | {budget_label(b)} | " + " | ".join(vals) + f" | {mean} |")
    return "Accuracy over every length and depth (recall: the share of expected answers found; mean: of the tasks' accuracies)\n\n" + "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", default="docs/ruler/merged/results.jsonl")
    rows = load(ap.parse_args().results)
    print(overall(rows), end="\n\n")
    print(table(rows, "acc_len", "prompt length (tokens)"), end="\n\n")
    print(table(rows, "acc_depth", "needle depth (fraction of the filler; cwe has none)", skip=("cwe",)))


if __name__ == "__main__":
    main()
