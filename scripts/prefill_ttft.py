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

With --llama-server PATH, llama.cpp's server on the same GGUF joins as one
more engine per --llama-fa setting (flash attention on/off/auto): started
per run like kvslim (one slot, the same threads), it gets the same text as
one /completion of one token, and its own prompt timing (`timings.prompt_ms`,
which leaves out the HTTP request and tokenizing) is its time to first
token; a short warm-up chat comes first, as in bench_serving.py. The
engines take turns going first, round by round.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

from bench_serving import Engine, free_port

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
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary: adds it as an engine")
    ap.add_argument("--llama-fa", action="append", choices=["on", "off", "auto"],
                    help="llama-server's --flash-attn, one engine each (default: auto)")
    a = ap.parse_args()

    with open(a.text, encoding="utf-8") as f:
        f.seek(0)
        text = f.read()[a.offset : a.offset + a.chars]
    if len(text) < a.chars:
        sys.exit(f"error: {a.text} has fewer than {a.offset + a.chars} characters")
    prompt = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    prompt.write(text)
    prompt.close()

    engines = list(a.policy)
    if a.llama_server:
        engines += [f"llama-server -fa {fa}" for fa in a.llama_fa or ["auto"]]
        gguf = subprocess.run([a.bin, "fetch", a.model], capture_output=True, text=True, check=True).stdout.split()[-1]
    runs = {e: [] for e in engines}
    for r in range(a.rounds):
        for engine in engines[r % len(engines):] + engines[:r % len(engines)]:
            if engine.startswith("llama-server"):
                row = llama_server(a, gguf, engine.split()[-1], text)
            else:
                row = kvslim(a, engine, prompt.name)
            row.update({"model": a.model, "policy": engine, "round": r, "threads": a.threads})
            runs[engine].append(row)
            print(f"round {r}: {engine}: {row['ttft_s']:.1f} s ({row['prompt_tokens']} tokens)", file=sys.stderr)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    os.unlink(prompt.name)

    base = statistics.median(r["ttft_s"] for r in runs[engines[0]])
    print(f"| engine | prompt tokens | time to first token, median of {a.rounds} (s) | prefill tok/s | × {engines[0]} |")
    print("|---|---:|---:|---:|---:|")
    for engine, rows in runs.items():
        m = statistics.median(r["ttft_s"] for r in rows)
        n = rows[0]["prompt_tokens"]
        print(f"| `{engine}` | {n} | {m:.1f} | {n / m:.1f} | {m / base:.2f} |")


def kvslim(a, policy, prompt_file):
    """One `kvslim generate --max-tokens 1`: its time to first token."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [a.bin, "generate", "-m", a.model, "--prompt-file", prompt_file, "--max-tokens", "1",
         "--threads", str(a.threads), "--policy", policy, "--json"],
        capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: {policy}: {out.stderr.strip()}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    d = json.loads(out.stdout)
    return {"prompt_tokens": d["prompt_tokens"], "ttft_s": d["time_to_first_token_s"],
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def llama_server(a, gguf, fa, text):
    """One llama-server started for this run (one slot, room for the text):
    its own prompt timing of a one-token /completion."""
    port = free_port()
    cmd = [a.llama_server, "-m", gguf, "-c", str(len(text) // 2 + 64), "-np", "1", "-t", str(a.threads),
           "-tb", str(a.threads), "-fa", fa, "--port", str(port)]
    server = Engine(f"llama-server -fa {fa}", cmd, port)
    try:
        conn, resp = server.post("/completion", {"prompt": text, "n_predict": 1, "temperature": 0,
                                                 "cache_prompt": False})
        d = json.loads(resp.read())
        conn.close()
        if resp.status != 200:
            sys.exit(f"error: llama-server: HTTP {resp.status}: {d}")
        t = d["timings"]
        return {"prompt_tokens": t["prompt_n"], "ttft_s": t["prompt_ms"] / 1e3}
    finally:
        server.stop()


if __name__ == "__main__":
    main()
