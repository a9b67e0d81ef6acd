#!/usr/bin/env python3
"""Does the KVzip-style probe keep a planted code's tokens? Uniform per-head
budgets against one threshold over every layer and KV head (KVzip's own
selection), on real text (issue #50):

    python3 scripts/kvzip_kept.py [--model qwen2.5-coder-0.5b] [--tokens 3800]
        [--seed 0 --seed 1] [--share 0.125 --share 0.25]

Per seed: WikiText-2 test paragraphs (digits removed, so the haystack's own
numbers are out of the way) of about --tokens tokens with "The secret access
code is NNNNNNN." planted between paragraphs at a random depth; the prompt is
prefilled under `h2o:…,prefill=kvzip` with a budget of all but two tokens,
so the kept slots carry the probe's score of (nearly) every token. Then, per
kept share, how many (layer, KV head) units hold all of the code's tokens
when every unit keeps its own top share, and when one threshold over all
units keeps the same total (the layers that hold it listed). Needs the
Python package (`bash python/ci.sh` installs it into target/python-venv).
"""
import argparse
import json
import random
import re
import sys

import kvslim

WIKITEXT = "../shared/data/wikitext2/wiki.test.raw"


def haystack(model, tokens, rng):
    """Token ids of the planted text and the code's token positions."""
    lines = [l.strip() for l in open(WIKITEXT) if l.strip() and not l.strip().startswith("=")]
    paras, n = [], 0
    for line in lines[rng.randrange(len(lines) - 400):]:
        line = re.sub(r"\d", "", line)
        paras.append(line)
        n += len(model.tokenize(line)) + 1
        if n > tokens:
            break
    code = "".join(str(rng.randrange(10)) for _ in range(7))
    depth = rng.choice([0.1, 0.3, 0.5, 0.7, 0.9])
    paras.insert(int(len(paras) * depth), f"The secret access code is {code}.")
    ids = model.tokenize("\n".join(paras))
    code_ids = model.tokenize(" " + code)
    at = next(i for i in range(len(ids)) if ids[i:i + len(code_ids)] == code_ids)
    return ids, list(range(at, at + len(code_ids))), depth


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=3800)
    ap.add_argument("--seed", type=int, action="append")
    ap.add_argument("--share", type=float, action="append")
    a = ap.parse_args()
    model = kvslim.Model(a.model)
    for seed in a.seed or [0, 1, 2, 3]:
        ids, code, depth = haystack(model, a.tokens, random.Random(seed))
        n = len(ids)
        r = model.perplexity(tokens=ids, policy=f"h2o:heavy={n - 3},recent=1,prefill=kvzip", prefill=n,
                             compare_full=False)
        kv_heads = len(r.kept[0])
        units = [dict(zip(map(int, k), map(float, s))) for kl, sl in zip(r.kept, r.scores) for k, s in zip(kl, sl)]
        everything = sorted((s for u in units for s in u.values()), reverse=True)
        row = {"seed": seed, "tokens": n, "depth": depth, "units": len(units)}
        for share in a.share or [0.125, 0.25]:
            b = int(share * n)
            threshold = everything[b * len(units) - 1]
            own = [set(sorted(u, key=lambda p: -u[p])[:b]) for u in units]
            holds_uniform = sum(all(p in k for p in code) for k in own)
            holds_global = [i for i, u in enumerate(units) if all(u.get(p, -1.0) >= threshold for p in code)]
            shares = [sum(s >= threshold for s in u.values()) / n for u in units]
            row[str(share)] = {"uniform": holds_uniform, "global": len(holds_global),
                               "global_layers": sorted({i // kv_heads for i in holds_global}),
                               "global_unit_share_min_max": [round(min(shares), 3), round(max(shares), 3)]}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
