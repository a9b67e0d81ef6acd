#!/usr/bin/env python3
"""Compress once, ask many, measured through `kvslim serve` (issue #47).

A document (the start of WikiText-2 test: two Wikipedia articles) is
compressed once per policy with `POST /v1/contexts` (framed as a chat's
first user message), then asked eight questions through
`/v1/chat/completions` with `context`, one at a time, streamed: the time
to first token is measured at the client. Then four questions at once on
one context while the server's RSS is sampled, and a restart on the same
`--contexts-dir` (start-up time with the contexts loaded, then a question).
The full cache's compression is the full prefill the others are compared
with. Writes OUT/contexts.json and prints a Markdown table.

    python3 scripts/contexts_bench.py --model qwen2.5-coder-1.5b --chars 16000 --out docs/contexts/4k
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import shutil
import tempfile
import urllib.request

QUESTIONS = [
    ("Which play written by Simon Stephens did Robert Boulter star in?", "Herons"),
    ("Who directed the 2007 production of How to Curse?", "Rourke"),
    ("What character did Boulter play in Donkey Punch?", "Sean"),
    ("In which year was Du Fu born?", "712"),
    ("Which poet did Du Fu meet in the autumn of 744?", "Li Bai"),
    ("Which rebellion began in December 755?", "An Lushan"),
    ("Who partly raised Du Fu after his mother died?", "aunt"),
    ("Which city did Du Fu leave for on December 24, 759?", "Chengdu"),
]
BRIEF = " Answer in one short sentence."


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def call(base, method, path, body=None, timeout=7200):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def ask(base, ctx, question, max_tokens):
    """Streams one answer; returns (seconds to first token, seconds in all, text)."""
    body = {"context": ctx, "messages": [{"role": "user", "content": question + BRIEF}],
            "max_tokens": max_tokens, "temperature": 0}
    return stream_chat(base, body)


def stream_chat(base, body):
    """Streams a chat completion; returns (seconds to first token, seconds in all, text)."""
    body = dict(body, stream=True)
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    first, text = None, []
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            piece = chunk["choices"][0]["delta"].get("content") or ""
            if piece and first is None:
                first = time.monotonic() - start
            text.append(piece)
    return first or 0.0, time.monotonic() - start, "".join(text).strip()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Server:
    def __init__(self, args, ctx_dir):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [args.bin, "serve", "--model", args.model, "--port", str(self.port), "--threads", str(args.threads),
               "--kv-memory", args.kv_memory, "--contexts-dir", ctx_dir, "--request-timeout", "0"]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stderr=open(os.path.join(args.out, "serve.log"), "a"))
        while True:
            try:
                call(self.base, "GET", "/health", timeout=2)
                break
            except Exception:
                if self.proc.poll() is not None:
                    sys.exit("kvslim serve exited; see serve.log")
                time.sleep(0.2)
        self.ready_s = time.monotonic() - self.started

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def llama_slots(args, doc):
    """llama-server's answer to the same need: prefill the chat-framed
    document into slot 0, save the slot to a file, erase it, restore it,
    then ask the first question (its prompt cache reuses the restored
    prefix). Returns sizes and times."""
    gguf = args.gguf or subprocess.run([args.bin, "fetch", args.model], capture_output=True, text=True,
                                       check=True).stdout.strip()
    slot_dir = tempfile.mkdtemp(prefix="llama-slots-")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ctx = int(args.chars / 3) + 2048
    proc = subprocess.Popen([args.llama_server, "-m", gguf, "--port", str(port), "-t", str(args.threads), "-tb",
                             str(args.threads), "-np", "1", "-c", str(ctx), "--slot-save-path", slot_dir,
                             "--no-webui"], stderr=open(os.path.join(args.out, "llama-server.log"), "w"),
                            stdout=subprocess.DEVNULL)
    try:
        while True:
            try:
                call(base, "GET", "/health", timeout=2)
                break
            except Exception:
                if proc.poll() is not None:
                    sys.exit("llama-server exited; see llama-server.log")
                time.sleep(0.5)
        messages = [{"role": "user", "content": doc}]
        start = time.monotonic()
        call(base, "POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 1, "temperature": 0})
        prefill_s = time.monotonic() - start
        saved = call(base, "POST", "/slots/0?action=save", {"filename": "doc.bin"})
        file_bytes = os.path.getsize(os.path.join(slot_dir, "doc.bin"))
        call(base, "POST", "/slots/0?action=erase", {})
        start = time.monotonic()
        restored = call(base, "POST", "/slots/0?action=restore", {"filename": "doc.bin"})
        restore_s = time.monotonic() - start
        q = QUESTIONS[0][0] + BRIEF
        first, _, text = stream_chat(base, {"messages": messages + [{"role": "user", "content": q}],
                                            "max_tokens": args.max_tokens, "temperature": 0})
        return {"prefill_s": prefill_s, "file_bytes": file_bytes, "save": saved, "restore": restored,
                "restore_s": restore_s, "question_ttft_s": first, "answer": text}
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(slot_dir)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/kvslim")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--chars", type=int, default=16000, help="characters of WikiText-2 test (about 4 per token)")
    ap.add_argument("--policies", default="full;h2o:heavy=6.25%,recent=6.25%,prefill=kvzip;"
                    "h2o:heavy=6.25%,recent=6.25%,prefill=snap:32;h2o:heavy=6.25%,recent=6.25%")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-memory", default="8GiB")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--shared", default=os.environ.get("KVSLIM_SHARED", "../shared"))
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary: also measure its slot save/restore "
                    "of the same document (shared/perf/README.md builds it)")
    ap.add_argument("--gguf", help="the model's GGUF file for llama-server (default: `kvslim fetch MODEL`)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    # the files (hundreds of MiB for the full cache) stay out of the repository
    ctx_dir = tempfile.mkdtemp(prefix="kvslim-contexts-")
    with open(os.path.join(args.shared, "data/wikitext2/wiki.test.raw"), encoding="utf-8", newline=None) as f:
        doc = f.read()[: args.chars]

    srv = Server(args, ctx_dir)
    rows = []
    for policy in args.policies.split(";"):
        made = call(srv.base, "POST", "/v1/contexts",
                    {"messages": [{"role": "user", "content": doc}], "kv_policy": policy})
        file_bytes = os.path.getsize(os.path.join(ctx_dir, made["id"] + ".kvctx"))
        answers = []
        for q, want in QUESTIONS:
            ttft, total, text = ask(srv.base, made["id"], q, args.max_tokens)
            answers.append({"question": q, "expected": want, "answer": text, "found": want.lower() in text.lower(),
                            "ttft_s": ttft, "total_s": total})
            print(f"[{policy}] {ttft:.2f} s  {q} -> {text!r}", file=sys.stderr)
        # four at once on this context, RSS sampled every 20 ms
        before = rss_kib(srv.proc.pid)
        peak = [before]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], rss_kib(srv.proc.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        threads = [threading.Thread(target=ask, args=(srv.base, made["id"], QUESTIONS[i][0], args.max_tokens))
                   for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        sampler.join()
        rows.append({"policy": policy, "context": made, "file_bytes": file_bytes, "answers": answers,
                     "rss_before_kib": before, "rss_peak_4_kib": peak[0]})
    srv.stop()
    # a restart on the same folder: every context loads at start-up
    again = Server(args, ctx_dir)
    for row in rows:
        ttft, total, text = ask(again.base, row["context"]["id"], QUESTIONS[0][0], args.max_tokens)
        row["after_restart"] = {"ttft_s": ttft, "answer": text}
    restart_ready = again.ready_s
    again.stop()
    shutil.rmtree(ctx_dir)

    out = {"model": args.model, "chars": args.chars, "tokens": rows[0]["context"]["tokens"],
           "restart_ready_s": restart_ready, "rows": rows}
    if args.llama_server:
        try:
            out["llama_server"] = llama_slots(args, doc)
        except Exception as e:  # keep kvslim's measurements whatever happens to the peer's
            out["llama_server"] = {"error": repr(e)}
    with open(os.path.join(args.out, "contexts.json"), "w") as f:
        json.dump(out, f, indent=1)
    full = next((r for r in rows if r["policy"] == "full"), rows[0])
    print(f"\n{out['tokens']}-token document, {args.model}; server ready after a restart with "
          f"{len(rows)} contexts in {restart_ready:.1f} s\n")
    print("| policy | compress (s) | Q1 first token incl. compress (s) | Q2–8 first token, median (s) "
          "| after restart (s) | file / full K/V, same dtype | RSS +4 questions | answers found |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        a = r["answers"]
        later = sorted(x["ttft_s"] for x in a[1:])
        med = later[len(later) // 2]
        rss = (r["rss_peak_4_kib"] - r["rss_before_kib"]) / 1024
        print(f"| `{r['policy']}` | {r['context']['seconds']:.1f} | {r['context']['seconds'] + a[0]['ttft_s']:.1f} "
              f"| {med:.2f} | {r['after_restart']['ttft_s']:.2f} | {r['file_bytes'] / 2**20:.1f} MiB / "
              f"{r['context']['kv_bytes_full'] / 2**20:.1f} MiB | {rss:+.1f} MiB | {sum(x['found'] for x in a)}/{len(a)} |")
    if "error" in out.get("llama_server", {}):
        print(f"\nllama-server failed: {out['llama_server']['error']}")
    elif "llama_server" in out:
        ls = out["llama_server"]
        print(f"\nllama-server (f16 KV, one slot): prefill {ls['prefill_s']:.1f} s, slot file "
              f"{ls['file_bytes'] / 2**20:.1f} MiB, restore {ls['restore_s']:.2f} s, then the first question's "
              f"first token {ls['question_ttft_s']:.2f} s: {ls['answer']!r}")


if __name__ == "__main__":
    main()
