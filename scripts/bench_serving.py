#!/usr/bin/env python3
"""Serving throughput: `kvslim serve` against llama.cpp's `llama-server` on
the same GGUF, the same load and the same KV memory, one engine at a time,
engines in rotating order each round:

    python3 scripts/bench_serving.py --llama-server PATH/build/bin/llama-server
        [--model qwen2.5-coder-1.5b] [--load decode --load prefill] [--clients 16 --clients 4]
        [--kvslim full:kv_dtype=f16 --kvslim h2o:heavy=10%,recent=10%,kv_dtype=q8]
        [--kv-seqs 4] [--threads 2] [--rounds 2] [--answer-tokens T] [--out serving.json]

Loads (N concurrent streamed chat requests, greedy, distinct prompts so no
request reuses another's prefix):
  prefill  ~2K-token prompts (the start of an LCC stdlib file from
           ../shared/data/code_completion, continue the code), 128-token answers
  decode   ~256-token prompts (a shorter code piece, explain it), 512-token answers

KV memory: `--kv-seqs` full sequences of the load's prompt + answer, in f16
(the model's KV bytes per token from `kvslim info --json`): llama-server gets
`-c` of that many tokens and `-np` = kv-seqs slots; kvslim gets
`--kv-memory` of the same bytes and `--max-batch N`, so a compressed policy
fits more sequences into the same bytes. Every kvslim engine is a policy,
sent as the server's `--policy`, optionally followed by more `kvslim serve`
flags (`--kvslim "full:kv_dtype=f16 --mixed-chunk 0"`).

Per engine and run: aggregate completion tokens/s (all completion tokens over
the wall time from the first request to the last answer), TTFT p50/p95,
time per output token p50/p95 (per request: first chunk to last over the
tokens after the first), requests per minute and the server's peak RSS
(VmHWM). Completion tokens are the `usage` each engine reports. Medians
over rounds; the raw runs go to --out.
"""
import argparse
import http.client
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KVSLIM = os.path.join(ROOT, "target", "release", "kvslim")
LCC = os.path.join(ROOT, "..", "shared", "data", "code_completion", "stdlib_lcc.jsonl")
# prompt characters, answer tokens; code runs ~3.5 characters a Qwen token
LOADS = {"prefill": (7000, 128, "Continue this Python file:\n\n```python\n{code}\n```"),
         "decode": (900, 512, "Explain in detail what this Python code does, line by line:\n\n```python\n{code}\n```")}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pieces(files, chars, n):
    """`n` pieces of `chars` characters that share no text: the LCC set
    holds several items of one file (each context a prefix of the longest),
    so files are told apart by their start and each is cut into
    consecutive pieces, taken file by file in turn."""
    longest = {}
    for f in files:
        key = f[:500]
        if len(f) > len(longest.get(key, "")):
            longest[key] = f
    cuts = [[f[i:i + chars] for i in range(0, len(f) - chars + 1, chars)] for f in longest.values()]
    out = [c[k] for k in range(max(map(len, cuts), default=0)) for c in cuts if k < len(c)]
    if len(out) < n:
        sys.exit(f"error: the LCC files hold only {len(out)} distinct pieces of {chars} characters, not {n}")
    return out[:n]


def prompts(load, n):
    """`n` prompts of the load over distinct pieces of stdlib files, so no
    request can reuse another's prefix beyond the template's first line."""
    chars, _, template = LOADS[load]
    files = [json.loads(line)["context"] for line in open(LCC)]
    return [template.format(code=c) for c in pieces(files, chars, n)]


class Engine:
    """One server process: started, warmed up, timed, stopped."""

    def __init__(self, name, cmd, port):
        self.name, self.port = name, port
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            if self.proc.poll() is not None or time.time() - t0 > 600:
                sys.exit(f"{name} did not start: {' '.join(cmd)}")
            time.sleep(0.5)
        self.chat("Say hi.", 2)

    def chat(self, prompt, max_tokens):
        """Streams one greedy chat answer: (TTFT s, decode s after the first
        chunk, completion tokens, prompt tokens)."""
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        conn, resp = self.post("/v1/chat/completions", body)
        if resp.status != 200:
            sys.exit(f"{self.name}: HTTP {resp.status}: {resp.read()[:300]!r}")
        first = last = None
        usage = None
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                last = time.perf_counter()
                first = first or last
        conn.close()
        if usage is None or first is None:
            sys.exit(f"{self.name}: an answer without usage or content")
        return first - start, last - first, usage["completion_tokens"], usage["prompt_tokens"]

    def post(self, path, body):
        """Sends one JSON POST: the connection and its response, unread."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=7200)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        return conn, conn.getresponse()

    def peak_rss(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def run_load(engine, texts, max_tokens):
    """All `texts` at once; per-request results and the wall time."""
    results = [None] * len(texts)

    def client(i):
        results[i] = engine.chat(texts[i], max_tokens)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(texts))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - start


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summarize(results, wall, rss):
    tokens = sum(r[2] for r in results)
    tpot = [r[1] / (r[2] - 1) for r in results if r[2] > 1]
    return {"wall_s": wall, "completion_tokens": tokens, "prompt_tokens": sum(r[3] for r in results),
            "tok_s": tokens / wall, "requests_per_min": 60 * len(results) / wall,
            "ttft_p50_s": pct([r[0] for r in results], 50), "ttft_p95_s": pct([r[0] for r in results], 95),
            "tpot_p50_s": pct(tpot, 50) if tpot else None, "tpot_p95_s": pct(tpot, 95) if tpot else None,
            "peak_rss_bytes": rss}


def kvslim_engine(spec):
    """A `--kvslim` engine: its policy and any further `kvslim serve` flags."""
    policy, *extra = shlex.split(spec)
    return policy, extra


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--load", action="append", choices=sorted(LOADS))
    ap.add_argument("--clients", action="append", type=int)
    ap.add_argument("--kvslim", action="append", metavar="POLICY")
    ap.add_argument("--kv-seqs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--answer-tokens", type=int, help="override the load's answer length (smoke tests)")
    ap.add_argument("--out")
    a = ap.parse_args()
    loads, clients = a.load or ["decode", "prefill"], a.clients or [16]
    policies = a.kvslim or ["full:kv_dtype=f16", "h2o:heavy=10%,recent=10%", "h2o:heavy=10%,recent=10%,kv_dtype=q8"]
    path = subprocess.run([KVSLIM, "fetch", a.model], capture_output=True, text=True, check=True).stdout.split()[-1]
    info = json.loads(subprocess.run([KVSLIM, "info", "--model", path, "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    c = info["config"]
    f16_bytes_per_token = c["n_layers"] * c["n_kv_heads"] * c["head_dim"] * 2 * 2
    runs, rows = [], []
    for load in loads:
        answer = a.answer_tokens or LOADS[load][1]
        for n in clients:
            texts = prompts(load, n)
            # one full sequence: the longest prompt (measured below) + the answer
            seq_tokens = None
            engines = ["llama-server"] + policies
            got = {e: [] for e in engines}
            for r in range(a.rounds):
                for e in engines[r % len(engines):] + engines[:r % len(engines)]:
                    port = free_port()
                    if seq_tokens is None:
                        # size the KV memory from the real prompt lengths, on llama-server's tokenizer
                        probe = Engine("probe", [a.llama_server, "-m", path, "-c", "32768", "-t", str(a.threads),
                                                 "--port", str(port)], port)
                        seq_tokens = max(probe.chat(t, 1)[3] for t in texts) + answer + 16
                        probe.stop()
                        port = free_port()
                    ctx = a.kv_seqs * seq_tokens
                    kv_bytes = ctx * f16_bytes_per_token
                    if e == "llama-server":
                        cmd = [a.llama_server, "-m", path, "-c", str(ctx), "-np", str(a.kv_seqs), "-t", str(a.threads),
                               "-tb", str(a.threads), "--port", str(port)]
                    else:
                        policy, extra = kvslim_engine(e)
                        cmd = [KVSLIM, "serve", "--model", path, "--policy", policy, "--kv-memory", f"{kv_bytes}B",
                               "--max-batch", str(max(n, 1)), "--queue-limit", str(max(64, n)), "--threads",
                               str(a.threads), "--port", str(port)] + extra
                    eng = Engine(e, cmd, port)
                    try:
                        results, wall = run_load(eng, texts, answer)
                        s = summarize(results, wall, eng.peak_rss())
                    finally:
                        eng.stop()
                    s.update({"engine": e, "load": load, "clients": n, "round": r, "kv_bytes": kv_bytes,
                              "kv_tokens_llama": ctx})
                    runs.append(s)
                    got[e].append(s)
                    print(f"{load:<8} N={n:<3} {e:<40} round {r}: {s['tok_s']:6.2f} tok/s, wall {wall:7.1f} s, "
                          f"TTFT p50 {s['ttft_p50_s']:.1f} s, RSS {s['peak_rss_bytes'] / 2**30:.2f} GiB",
                          file=sys.stderr, flush=True)
            base = statistics.median(x["tok_s"] for x in got["llama-server"])
            for e in engines:
                med = lambda k: statistics.median(x[k] for x in got[e] if x[k] is not None)
                rows.append({"load": load, "clients": n, "engine": e, "tok_s": med("tok_s"),
                             "vs_llama": med("tok_s") / base, "ttft_p50_s": med("ttft_p50_s"),
                             "ttft_p95_s": med("ttft_p95_s"), "tpot_p50_s": med("tpot_p50_s"),
                             "tpot_p95_s": med("tpot_p95_s"), "requests_per_min": med("requests_per_min"),
                             "peak_rss_gib": med("peak_rss_bytes") / 2**30, "kv_mib": got[e][0]["kv_bytes"] / 2**20})
    print("| load | N | engine | tok/s | × llama-server | TTFT p50 / p95 (s) | TPOT p50 / p95 (ms) | req/min | "
          "peak RSS (GiB) | KV (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['load']} | {r['clients']} | `{r['engine']}` | {r['tok_s']:.1f} | {r['vs_llama']:.2f} | "
              f"{r['ttft_p50_s']:.1f} / {r['ttft_p95_s']:.1f} | {1e3 * r['tpot_p50_s']:.0f} / "
              f"{1e3 * r['tpot_p95_s']:.0f} | {r['requests_per_min']:.1f} | {r['peak_rss_gib']:.2f} | "
              f"{r['kv_mib']:.0f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": path, "threads": a.threads, "kv_seqs": a.kv_seqs, "rows": rows, "runs": runs}, f,
                      indent=1)


if __name__ == "__main__":
    main()
