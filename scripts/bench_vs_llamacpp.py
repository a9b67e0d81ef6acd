#!/usr/bin/env python3
"""kvslim against llama.cpp, side by side on one GGUF: prefill and decode
tokens/s at several context lengths, the two engines run alternately in
every round (this VM's timings move 15-30% between runs; only ratios taken
in one run mean anything).

Builds nothing. llama.cpp comes from a llama-cpp-python build as in
../shared/perf/README.md; run this script with that environment's python:

    ~/.venv-llamacpp/bin/python scripts/bench_vs_llamacpp.py MODEL.gguf \
        [--contexts 512,2048] [--rounds 2] [--gen 64] [--threads 2] [--repeats 3] \
        [--policy full:kv_dtype=f16 --policy full ...] [--out bench.json]

kvslim is `target/release/kvslim` (cargo build --release first). llama.cpp
keeps an f16 KV cache; compare it with kvslim's `kv_dtype=f16` row.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("KVSLIM_SHARED", os.path.join(ROOT, "..", "shared"))


def llamacpp(model, threads, ctx, gen, text):
    script = os.path.join(SHARED, "perf", "llamacpp_bench.py")
    out = subprocess.run([sys.executable, script, model, str(threads), str(ctx), str(gen), text],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"prefill ([\d.]+) tok/s, decode ([\d.]+) tok/s", out)
    if not m:
        raise SystemExit(f"unexpected llama.cpp output: {out}")
    return float(m.group(1)), float(m.group(2))


def kvslim(model, threads, ctx, gen, policy, text, repeats):
    exe = os.path.join(ROOT, "target", "release", "kvslim")
    out = subprocess.run([exe, "bench", "--model", model, "--threads", str(threads), "--prompt-len", str(ctx),
                          "--gen-len", str(gen), "--repeats", str(repeats), "--policy", policy, "--prompt-file", text,
                          "--json"], capture_output=True, text=True, check=True).stdout
    row = json.loads(out)[0]
    return row["prefill_tok_s"], row["decode_tok_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--contexts", default="512,2048,6000,8000")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="kvslim repeats per measurement (median)")
    ap.add_argument("--policy", action="append", help="kvslim policy (repeatable); default full:kv_dtype=f16 and full")
    ap.add_argument("--text", default=os.path.join(SHARED, "data", "wikitext2", "wiki.test.raw"))
    ap.add_argument("--out", help="write every measurement as JSON")
    a = ap.parse_args()
    policies = a.policy or ["full:kv_dtype=f16", "full"]
    contexts = [int(c) for c in a.contexts.split(",")]
    runs = {}  # (engine, ctx) -> [(prefill, decode)]
    for r in range(a.rounds):
        for ctx in contexts:
            engines = [("llama.cpp", lambda: llamacpp(a.model, a.threads, ctx, a.gen, a.text))]
            engines += [(f"kvslim {p}", lambda p=p: kvslim(a.model, a.threads, ctx, a.gen, p, a.text, a.repeats)) for p in policies]
            if r % 2 == 1:  # alternate which engine goes first
                engines.reverse()
            for name, run in engines:
                pre, dec = run()
                runs.setdefault((name, ctx), []).append((pre, dec))
                print(f"round {r + 1} ctx {ctx:>5} {name:<32} prefill {pre:8.1f} decode {dec:7.2f} tok/s", flush=True)
    print()
    print(f"| context | engine | prefill tok/s | decode tok/s | prefill × llama.cpp | decode × llama.cpp |")
    print("|---|---|---|---|---|---|")
    rows = []
    for ctx in contexts:
        base = runs[("llama.cpp", ctx)]
        bp = statistics.median(p for p, _ in base)
        bd = statistics.median(d for _, d in base)
        for name in ["llama.cpp"] + [f"kvslim {p}" for p in policies]:
            ms = runs[(name, ctx)]
            p = statistics.median(x for x, _ in ms)
            d = statistics.median(y for _, y in ms)
            print(f"| {ctx:,} | {name} | {p:.1f} | {d:.2f} | {p / bp:.2f} | {d / bd:.2f} |")
            rows.append({"context": ctx, "engine": name, "prefill_tok_s": p, "decode_tok_s": d,
                         "prefill_ratio": p / bp, "decode_ratio": d / bd, "runs": ms})
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "gen": a.gen, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
