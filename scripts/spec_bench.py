#!/usr/bin/env python3
"""Speculative decoding against plain greedy decoding, side by side, on the
chat-formatted prompts in scripts/spec_prompts/ (copy_*: code edits whose
answer mostly copies the prompt; nocopy_*: answers that don't):

    python3 scripts/spec_bench.py [--model qwen2.5-coder-1.5b] [--max-tokens 96]
        [--policy full --policy h2o:heavy=128,recent=128]
        [--drafter ngram --drafter model:qwen2.5-coder-0.5b --drafter ngram+model:qwen2.5-coder-0.5b]
        [--draft-len auto] [--prompts 'nocopy_*'] [--rounds 1] [--out spec.json]

Runs `target/release/kvslim generate --json` plainly and with each drafter
(`ngram`, the default; `self`; `model:MODEL` and `ngram+model:MODEL`, which
pass `--draft-model MODEL`), engines in rotating order each round, checks
that the tokens are identical, and prints decode tok/s, the speed-up and the
tokens per target pass for each prompt, policy and drafter (medians over
rounds).
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(model, prompt_file, max_tokens, policy, drafter, draft_len):
    cmd = [os.path.join(ROOT, "target", "release", "kvslim"), "generate", "--model", model, "--prompt-file",
           prompt_file, "--max-tokens", str(max_tokens), "--temperature", "0", "--policy", policy, "--json"]
    if drafter:
        kind, _, draft_model = drafter.partition(":")
        cmd += ["--speculative", kind, "--draft-len", draft_len]
        if draft_model:
            cmd += ["--draft-model", draft_model]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--policy", action="append")
    ap.add_argument("--drafter", action="append")
    ap.add_argument("--draft-len", default="auto")
    ap.add_argument("--prompts", default="*", help="which of scripts/spec_prompts/*.txt (a glob, e.g. 'nocopy_*')")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out")
    a = ap.parse_args()
    policies = a.policy or ["full", "h2o:heavy=128,recent=128"]
    drafters = a.drafter or ["ngram"]
    prompts = sorted(glob.glob(os.path.join(ROOT, "scripts", "spec_prompts", a.prompts + ".txt")))
    rows = []
    for policy in policies:
        for p in prompts:
            engines = [None] + drafters
            tok_s = {e: [] for e in engines}
            passes = {e: [] for e in drafters}
            for r in range(a.rounds):
                order = engines[r % len(engines):] + engines[:r % len(engines)]
                got = {e: run(a.model, p, a.max_tokens, policy, e, a.draft_len) for e in order}
                for e in engines:
                    if got[e]["token_ids"] != got[None]["token_ids"]:
                        sys.exit(f"{os.path.basename(p)} {policy} {e}: speculative tokens differ from plain greedy")
                    tok_s[e].append(got[e]["decode_tok_s"])
                    if e:
                        passes[e].append(got[e]["speculative"]["tokens_per_pass"])
            for e in drafters:
                row = {"prompt": os.path.basename(p)[:-4], "policy": policy, "drafter": e, "draft_len": a.draft_len,
                       "tokens": len(got[None]["token_ids"]), "plain_tok_s": statistics.median(tok_s[None]),
                       "spec_tok_s": statistics.median(tok_s[e]), "tokens_per_pass": statistics.median(passes[e])}
                row["speedup"] = row["spec_tok_s"] / row["plain_tok_s"]
                rows.append(row)
                print(f"{row['prompt']:<20} {policy:<28} {e:<32} plain {row['plain_tok_s']:6.2f} "
                      f"spec {row['spec_tok_s']:6.2f} x{row['speedup']:.2f} ({row['tokens_per_pass']:.2f} tokens/pass)",
                      file=sys.stderr, flush=True)
    report(rows, "| prompt | policy | drafter | tokens | plain tok/s | speculative tok/s | speed-up | tokens per pass |",
           "| {prompt} | `{policy}` | `{drafter}` | {tokens} | {plain_tok_s:.2f} | {spec_tok_s:.2f} | {speedup:.2f} | "
           "{tokens_per_pass:.2f} |", a.out)


def report(rows, header, row_format, out):
    """Prints `rows` as a Markdown table under `header` (each row as
    `row_format.format(**row)`) and writes them to `out` as JSON when given."""
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for r in rows:
        print(row_format.format(**r))
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
