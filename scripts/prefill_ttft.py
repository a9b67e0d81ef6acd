#!/usr/bin/env python3
"""Time to first token of several policies on one prompt, side by side.

Runs `kvslim generate --max-tokens 1` once per policy per round, the
policies alternating within each round, and prints the median time to
first token per policy and its ratio to the first policy's; every run goes
to --out as a JSON line (policy, round, prompt tokens, seconds, CPU
seconds). The prompt is the first --chars characters of --text from
--offset (WikiText-2's test text by default).

  python3 scripts/prefill_ttft.py --model qwen2.5-coder-0.5b --chars 15500 \\
      --policy full --policy 'h2o:heavy=12.5%,recent=12.5%,prefill=kvzip' --rounds 2
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--policy", action="append", required=True, help="repeat: the first is the baseline")
    ap.add_argument("--text", default=os.path.join(ROOT, "..", "shared", "data", "wikitext2", "wiki.test.raw"))
    ap.add_argument("--offset", type=int, default=700000, help="first character of the prompt in --text")
    ap.add_argument("--chars", type=int, default=15500, help="prompt length in characters (~4 per token)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "kvslim"))
    ap.add_argument("--out", help="append every run as a JSON line")
    a = ap.parse_args()

    with open(a.text, encoding="utf-8") as f:
        f.seek(0)
        text = f.read()[a.offset : a.offset + a.chars]
    if len(text) < a.chars:
        sys.exit(f"error: {a.text} has fewer than {a.offset + a.chars} characters")
    prompt = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    prompt.write(text)
    prompt.close()

    runs = {p: [] for p in a.policy}
    for r in range(a.rounds):
        for policy in a.policy:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            out = subprocess.run(
                [a.bin, "generate", "-m", a.model, "--prompt-file", prompt.name, "--max-tokens", "1",
                 "--threads", str(a.threads), "--policy", policy, "--json"],
                capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"error: {policy}: {out.stderr.strip()}")
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            d = json.loads(out.stdout)
            row = {"model": a.model, "policy": policy, "round": r, "threads": a.threads,
                   "prompt_tokens": d["prompt_tokens"], "ttft_s": d["time_to_first_token_s"],
                   "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}
            runs[policy].append(row)
            print(f"round {r}: {policy}: {row['ttft_s']:.1f} s ({row['prompt_tokens']} tokens)", file=sys.stderr)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    os.unlink(prompt.name)

    base = statistics.median(r["ttft_s"] for r in runs[a.policy[0]])
    print(f"| policy | time to first token, median of {a.rounds} (s) | × {a.policy[0]} |")
    print("|---|---:|---:|")
    for policy, rows in runs.items():
        m = statistics.median(r["ttft_s"] for r in rows)
        print(f"| `{policy}` | {m:.1f} | {m / base:.2f} |")


if __name__ == "__main__":
    main()
