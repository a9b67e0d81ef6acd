#!/usr/bin/env python3
"""Speculative decoding in `kvslim serve`: one greedy request at a time (the
case the server speculates for), with and without `--no-speculative`, on the
chat-formatted prompts in scripts/spec_prompts/:

    python3 scripts/serve_spec_bench.py [--model qwen2.5-coder-1.5b] [--max-tokens 512]
        [--policy full --policy h2o:heavy=128,recent=128] [--rounds 1] [--out serve-spec.json]

Per round, one server with speculation and one without (alternating which
goes first), each answering every prompt under every policy: first a
one-token request (paged policies keep the prompt in the server's prefix
cache), then the timed request, streamed: decode tok/s counts the tokens
after its first chunk over the time from that chunk to the last. Checks that both servers return the same text and
prints decode tok/s, the speed-up and the server's accepted drafts per pass
(from /metrics), medians over rounds.
"""
import argparse
import glob
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

from spec_bench import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=900):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


class Server:
    def __init__(self, model, speculative):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [os.path.join(ROOT, "target", "release", "kvslim"), "serve", "--model", model, "--port", str(self.port)]
        if not speculative:
            cmd.append("--no-speculative")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while True:
            try:
                urllib.request.urlopen(self.base + "/health", timeout=5)
                return
            except Exception:
                if self.proc.poll() is not None or time.time() - t0 > 300:
                    sys.exit(f"server did not start: {' '.join(cmd)}")
                time.sleep(0.5)

    def answer(self, prompt, policy, max_tokens):
        """Streams one greedy answer: its text, tokens, decode seconds (first
        streamed chunk to the last) and the speculative passes and accepted
        drafts it took."""
        body = {"prompt": prompt, "temperature": 0, "kv_policy": policy}
        # paged policies keep the prompt in the prefix cache
        post(self.base + "/v1/completions", dict(body, max_tokens=1))
        before = metrics(self.base)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=900)
        conn.request("POST", "/v1/completions", json.dumps(dict(body, max_tokens=max_tokens, stream=True)),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        text, first, last = "", None, None
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            last = time.perf_counter()
            first = first or last
            text += json.loads(data)["choices"][0]["text"]
        conn.close()
        after = metrics(self.base)
        delta = lambda k: after[k] - before[k]
        return (text, int(delta("kvslim_generated_tokens_total")), last - first,
                delta("kvslim_speculative_passes_total"), delta("kvslim_draft_tokens_accepted_total"))

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--policy", action="append")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out")
    a = ap.parse_args()
    policies = a.policy or ["full", "h2o:heavy=128,recent=128"]
    prompts = sorted(glob.glob(os.path.join(ROOT, "scripts", "spec_prompts", "*.txt")))
    got = {}  # (prompt, policy, speculative) -> list of (text, tokens, seconds, passes, accepted)
    for r in range(a.rounds):
        for spec in ([True, False] if r % 2 == 0 else [False, True]):
            server = Server(a.model, spec)
            try:
                for policy in policies:
                    for p in prompts:
                        text = open(p).read()
                        got.setdefault((p, policy, spec), []).append(server.answer(text, policy, a.max_tokens))
            finally:
                server.stop()
    rows = []
    for policy in policies:
        for p in prompts:
            spec, plain = got[(p, policy, True)], got[(p, policy, False)]
            if any(s[0] != q[0] for s in spec for q in plain):
                sys.exit(f"{os.path.basename(p)} {policy}: the speculative server's text differs")
            # tokens after the first streamed chunk, over the time after it
            rate = lambda runs: statistics.median((n - 1) / dt for _, n, dt, _, _ in runs)
            n = spec[0][1]
            passes, accepted = spec[0][3], spec[0][4]
            row = {"prompt": os.path.basename(p)[:-4], "policy": policy, "tokens": n,
                   "plain_tok_s": rate(plain), "spec_tok_s": rate(spec),
                   "passes": passes, "accepted": accepted,
                   "tokens_per_pass": (passes + accepted) / passes if passes else 1.0}
            row["speedup"] = row["spec_tok_s"] / row["plain_tok_s"]
            rows.append(row)
    report(rows, "| prompt | policy | tokens | plain tok/s | speculative tok/s | speed-up | tokens per pass |",
           "| {prompt} | `{policy}` | {tokens} | {plain_tok_s:.2f} | {spec_tok_s:.2f} | {speedup:.2f} | {tokens_per_pass:.2f} |",
           a.out)


if __name__ == "__main__":
    main()
