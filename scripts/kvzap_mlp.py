#!/usr/bin/env python3
"""Does a 2-layer MLP predict KVzip's scores better than KVzap's linear fit? (issue #50)

Reads the training pairs `kvslim calibrate --kvzap --dump-pairs DIR` wrote (manifest.json and one
raw little-endian f32 file per window: per layer the normalised hidden states [n, hidden], then per
layer and KV head the scores [n]) and fits, per (layer, KV head), on the same train windows:

  linear  ridge regression of ln(score + 1e-6) on [1, x], the strength a multiple of the Gram
          matrix's mean diagonal from the grid kvslim uses, picked by held-out squared error:
          kvslim's own fit (crates/engine/src/kvzap.rs), so its held-out figures should match the
          file `calibrate` wrote from the same windows;
  mlp     x (standardised) -> HIDDEN units (GELU) -> 1, trained with Adam on minibatches, weight
          decay from a small grid, the epoch with the lowest held-out squared error kept (the same
          protocol as the ridge strength: hyperparameters picked on the held-out windows).

and prints, per predictor, the held-out figures kvslim's file records: mean (lowest) Spearman of
predicted and true scores over units, mean R², and the share of the true kept set the prediction
also keeps at 12.5% / 25%, with one threshold over all units (KVzip's selection, the prediction
capped at 0 as the policy caps it) and per unit. Needs numpy.

Usage: python3 scripts/kvzap_mlp.py DIR [--hidden 64] [--epochs 30] [--json OUT]
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

EPS = 1e-6
RIDGE_GRID = [1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0]
DECAY_GRID = [1e-4, 1e-2]


def load(folder):
    """(manifest, train windows, held-out windows); a window: (hidden [L, n, d], scores [L, H, n])."""
    m = json.loads((folder / "manifest.json").read_text())
    L, H, d = m["layers"], m["kv_heads"], m["hidden"]
    train, held = [], []
    for w in m["windows"]:
        n = w["tokens"]
        raw = np.fromfile(folder / w["file"], dtype="<f4")
        if raw.size != L * n * d + L * H * n:
            sys.exit(f"error: {w['file']} holds {raw.size} values, not {L * n * d + L * H * n}")
        pair = (raw[: L * n * d].reshape(L, n, d), raw[L * n * d:].reshape(L, H, n))
        (held if w["held_out"] else train).append(pair)
    if not train or not held:
        sys.exit("error: the dump needs train and held-out windows (calibrate --held-out 1 or more)")
    return m, train, held


def target(scores):
    return np.log(scores.astype(np.float64) + EPS)


def fit_linear(x, y, xh, yh):
    """Per head: the ridge weights [p] with the lowest held-out squared error (x: [n, d], y: [H, n])."""
    a = np.hstack([np.ones((x.shape[0], 1)), x.astype(np.float64)])
    ah = np.hstack([np.ones((xh.shape[0], 1)), xh.astype(np.float64)])
    gram, rhs = a.T @ a, a.T @ y.T  # [p, p], [p, H]
    lam0 = np.mean(np.diag(gram)[1:])
    best = [None] * y.shape[0]
    for alpha in RIDGE_GRID:
        g = gram.copy()
        g[np.arange(1, g.shape[0]), np.arange(1, g.shape[0])] += alpha * lam0
        w = np.linalg.solve(g, rhs)  # [p, H]
        err = ((ah @ w).T - yh) ** 2
        for h in range(y.shape[0]):
            e = err[h].sum()
            if best[h] is None or e < best[h][0]:
                best[h] = (e, w[:, h])
    return [lambda xx, w=b[1]: np.hstack([np.ones((xx.shape[0], 1)), xx.astype(np.float64)]) @ w for b in best]


def gelu(z):
    return 0.5 * z * (1.0 + np.tanh(0.7978845608 * (z + 0.044715 * z ** 3)))


def gelu_grad(z):
    t = np.tanh(0.7978845608 * (z + 0.044715 * z ** 3))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t ** 2) * 0.7978845608 * (1.0 + 3 * 0.044715 * z ** 2)


def fit_mlp(x, y, xh, yh, hidden, epochs, seed):
    """Per head: a predictor x -> y from a 2-layer MLP, each head its own net (the layer's heads
    side by side in one matrix product), the weight decay and epoch with the lowest held-out
    squared error."""
    mu, sd = x.mean(0), x.std(0) + 1e-6
    xs, xhs = ((x - mu) / sd).astype(np.float32), ((xh - mu) / sd).astype(np.float32)
    heads, n, d = y.shape[0], x.shape[0], x.shape[1]
    yt = y.astype(np.float32)
    best = [(math.inf, None)] * heads
    for decay in DECAY_GRID:
        rng = np.random.default_rng(seed)
        p = {"w1": rng.normal(0, 1 / math.sqrt(d), (d, heads * hidden)).astype(np.float32),
             "b1": np.zeros(heads * hidden, np.float32),
             "w2": rng.normal(0, 1 / math.sqrt(hidden), (heads, hidden)).astype(np.float32),
             "b2": y.mean(1).astype(np.float32)}
        m = {k: np.zeros_like(v) for k, v in p.items()}
        v = {k: np.zeros_like(v) for k, v in p.items()}
        step, lr, batch = 0, 1e-3, 512
        for _ in range(epochs):
            order = rng.permutation(n)
            for b0 in range(0, n, batch):
                idx = order[b0:b0 + batch]
                xb, yb = xs[idx], yt[:, idx]  # [b, d], [H, b]
                z = xb @ p["w1"] + p["b1"]  # [b, H*k]
                a = gelu(z).reshape(len(idx), heads, hidden)
                out = np.einsum("bhk,hk->hb", a, p["w2"]) + p["b2"][:, None]  # [H, b]
                g_out = 2 * (out - yb) / len(idx)
                g_z = (g_out.T[:, :, None] * p["w2"][None]).reshape(len(idx), -1) * gelu_grad(z)
                grads = {"w1": xb.T @ g_z, "b1": g_z.sum(0),
                         "w2": np.einsum("bhk,hb->hk", a, g_out), "b2": g_out.sum(1)}
                step += 1
                for k in p:
                    g = grads[k] + (decay * p[k] if k.startswith("w") else 0)
                    m[k] = 0.9 * m[k] + 0.1 * g
                    v[k] = 0.999 * v[k] + 0.001 * g * g
                    p[k] -= lr * (m[k] / (1 - 0.9 ** step)) / (np.sqrt(v[k] / (1 - 0.999 ** step)) + 1e-8)
            err = ((mlp_forward(p, xhs, heads, hidden) - yh) ** 2).sum(1)
            for h in range(heads):
                if err[h] < best[h][0]:
                    best[h] = (err[h], {k: val.copy() for k, val in p.items()}, decay)
    return [lambda xx, b=b, h=h: mlp_forward(b[1], ((xx - mu) / sd).astype(np.float32), heads, hidden)[h].astype(np.float64)
            for h, b in enumerate(best)]


def mlp_forward(p, xs, heads, hidden):
    a = gelu(xs @ p["w1"] + p["b1"]).reshape(len(xs), heads, hidden)
    return np.einsum("bhk,hk->hb", a, p["w2"]) + p["b2"][:, None]


def spearman(a, b):
    ra, rb = rank(a), rank(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den else 0.0


def rank(v):
    order = np.argsort(v, kind="stable")
    r = np.empty(len(v))
    r[order] = np.arange(len(v))
    # average ranks of ties
    _, inv, counts = np.unique(v, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=r)
    return sums[inv] / counts[inv]


def overlap(truth, pred, share):
    k = max(int(math.floor(share * len(truth))), 1)
    t = np.argsort(-truth, kind="stable")[:k]
    p = np.argsort(-pred, kind="stable")[:k]
    return len(np.intersect1d(t, p)) / k


def quality(preds, held):
    """kvslim's held-out figures (crates/engine/src/kvzap.rs kvzap_quality) for preds[l][h](x)."""
    sp, r2, u12, u25, g12, g25 = [], [], [], [], [], []
    for hidden, scores in held:
        all_t, all_p = [], []
        for l in range(len(preds)):
            for h in range(len(preds[l])):
                truth, pred = target(scores[l, h]), preds[l][h](hidden[l])
                sp.append(spearman(truth, pred))
                ss_tot = ((truth - truth.mean()) ** 2).sum()
                r2.append(1 - ((truth - pred) ** 2).sum() / ss_tot if ss_tot > 0 else 0.0)
                u12.append(overlap(truth, pred, 0.125))
                u25.append(overlap(truth, pred, 0.25))
                all_t.append(truth)
                all_p.append(np.minimum(pred, 0.0))
        all_t, all_p = np.concatenate(all_t), np.concatenate(all_p)
        g12.append(overlap(all_t, all_p, 0.125))
        g25.append(overlap(all_t, all_p, 0.25))
    r = lambda x: round(float(np.mean(x)), 4)  # noqa: E731
    return {"spearman_mean": r(sp), "spearman_min": round(min(sp), 4), "r2_mean": r(r2),
            "global_overlap_12_5": r(g12), "global_overlap_25": r(g25),
            "unit_overlap_12_5": r(u12), "unit_overlap_25": r(u25)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path, help="the folder calibrate --kvzap --dump-pairs wrote")
    ap.add_argument("--hidden", type=int, default=64, help="the MLP's hidden units (default 64)")
    ap.add_argument("--epochs", type=int, default=30, help="training epochs per weight decay (default 30)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    m, train, held = load(args.dir)
    L, H = m["layers"], m["kv_heads"]
    fits = {"linear": [], "mlp": []}
    start = time.time()
    for l in range(L):
        x = np.concatenate([w[0][l] for w in train])
        y = target(np.concatenate([w[1][l] for w in train], axis=1))
        xh = np.concatenate([w[0][l] for w in held])
        yh = target(np.concatenate([w[1][l] for w in held], axis=1))
        fits["linear"].append(fit_linear(x, y, xh, yh))
        fits["mlp"].append(fit_mlp(x, y, xh, yh, args.hidden, args.epochs, args.seed + l))
        print(f"layer {l + 1}/{L} fitted, {time.time() - start:.0f} s", file=sys.stderr)
    out = {"model": m["model"], "text": m["text"], "train_windows": len(train), "held_out_windows": len(held),
           "mlp_settings": {"hidden": args.hidden, "epochs": args.epochs, "decay_grid": DECAY_GRID, "seed": args.seed}}
    for name, preds in fits.items():
        out[name] = quality(preds, held)
    print("| predictor | Spearman, mean (lowest unit) | R² | global overlap 12.5% / 25% | per unit 12.5% / 25% |")
    print("|---|---:|---:|---:|---:|")
    for name in fits:
        q = out[name]
        print(f"| {name} | {q['spearman_mean']:.3f} ({q['spearman_min']:.3f}) | {q['r2_mean']:.3f} | "
              f"{100 * q['global_overlap_12_5']:.1f}% / {100 * q['global_overlap_25']:.1f}% | "
              f"{100 * q['unit_overlap_12_5']:.1f}% / {100 * q['unit_overlap_25']:.1f}% |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
