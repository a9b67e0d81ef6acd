"""The Python package against the references the Rust tests use
(../shared/fixtures/smollm2: what HF transformers computes for the SmolLM2
GGUF) and against the CLI."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

import kvslim
from conftest import REPO, shared, ticks_while

PROMPT = "The capital of France is Paris. The capital of Germany is"
H2O = "h2o:heavy=16,recent=16"


@pytest.fixture(scope="module")
def ids96(smollm2, smollm2_text, smollm2_ref):
    ids = smollm2.tokenize(smollm2_text)[:96]
    assert ids == smollm2_ref["input_ids"].tolist(), "tokenizer differs from HF on text.txt"
    return ids


@pytest.fixture(scope="module")
def full96(smollm2, ids96):
    return smollm2.perplexity(tokens=ids96)


@pytest.fixture(scope="module")
def h2o96(smollm2, ids96):
    return smollm2.perplexity(tokens=ids96, policy=H2O)


def test_nll_matches_hf_reference(smollm2_f32, ids96, full96, smollm2_ref):
    want = smollm2_ref["next_token_logprob"].astype(np.float64)
    exact = smollm2_f32.perplexity(tokens=ids96)
    assert exact.logprobs.dtype == np.float64 and exact.logprobs.shape == want.shape
    mean_abs = np.abs(exact.logprobs - want).mean()
    print(f"SmolLM2 NLL {exact.nll:.5f} (HF 3.3168), mean |Δ log-prob| {mean_abs:.2e}")
    assert mean_abs < 0.01
    assert np.abs(exact.logprobs - want).max() < 0.1
    assert abs(exact.nll - 3.3168) < 0.005
    assert exact.nll == pytest.approx(-exact.logprobs.mean(), abs=1e-12)
    assert exact.ppl == pytest.approx(np.exp(exact.nll))
    assert exact.kl is None and exact.policy == "full"
    # the default 8-bit activations: a few hundredths of a nat per token
    int8_abs = np.abs(full96.logprobs - want).mean()
    print(f"8-bit activations: NLL {full96.nll:.5f}, mean |Δ log-prob| {int8_abs:.3f}")
    assert int8_abs < 0.1 and abs(full96.nll - 3.3168) < 0.033


def test_prefill_scores_like_decode(smollm2, smollm2_f32, ids96, full96):
    # the same model through the two paths: equal to f32 rounding ...
    decode = smollm2_f32.perplexity(tokens=ids96)
    r = smollm2_f32.perplexity(tokens=ids96, prefill=len(ids96))
    assert r.report["decode_steps"] == 0
    np.testing.assert_allclose(r.logprobs, decode.logprobs, atol=1e-3)
    # ... while with 8-bit activations a rounding-level difference between
    # the paths moves an activation across a quantization step, and the
    # change spreads through the layers: the two paths then differ like two
    # draws of quantization noise (measured mean |Δ| 0.053 nats, about
    # what separates either from the f32 products)
    r8 = smollm2.perplexity(tokens=ids96, prefill=len(ids96))
    gap = np.abs(r8.logprobs - full96.logprobs)
    print(f"8-bit activations, prefill vs decode: mean |Δ| {gap.mean():.2e}, max {gap.max():.2e}")
    assert gap.mean() < 0.1 and abs(r8.nll - full96.nll) < 0.01 * full96.nll


def test_greedy_matches_reference(smollm2, smollm2_ref):
    prompt_ids = smollm2_ref["prompt_ids"].tolist()
    want = smollm2_ref["greedy_ids"].tolist()[len(prompt_ids) :]
    g = smollm2.generate(PROMPT, max_tokens=len(want))
    assert g.prompt_token_ids == prompt_ids
    assert g.token_ids == want
    assert str(g) == " Berlin. The capital of the United States is New York City"
    assert g.stop_reason == "max_tokens" and g.kv_bytes_allocated > 0


def test_speculative_generate_equals_greedy(smollm2):
    # an answer that copies its prompt, so drafts are accepted
    prompt = "Tom had a red ball. He liked to play with it in the park. " * 4
    for policy in ["full", "h2o:heavy=16,recent=16"]:
        plain = smollm2.generate(prompt, max_tokens=48, policy=policy)
        spec = smollm2.generate(prompt, max_tokens=48, policy=policy, speculative=True)
        assert spec.token_ids == plain.token_ids and spec.text == plain.text, policy
        assert plain.speculative is None
        s = spec.speculative
        assert s["accepted"] > 0 and s["target_passes"] < len(spec.token_ids), (policy, s)
    with pytest.raises(ValueError, match="temperature"):
        smollm2.generate(prompt, max_tokens=4, temperature=0.8, speculative=True)


def test_draft_model_generate_equals_greedy(smollm2, smollm2_f32, stories):
    # the same weights with f32 products drafting for the integer-product model
    prompt = "Once upon a time, there was a little girl named Lily. She"
    for policy in ["full", "h2o:heavy=16,recent=16"]:
        plain = smollm2.generate(prompt, max_tokens=32, policy=policy)
        spec = smollm2.generate(prompt, max_tokens=32, policy=policy, draft_model=smollm2_f32)
        assert spec.token_ids == plain.token_ids, policy
        s = spec.speculative
        assert s["accepted"] > s["drafted"] // 2 and s["target_passes"] < len(spec.token_ids), (policy, s)
    own = smollm2.generate(prompt, max_tokens=16, draft_model=smollm2_f32, draft_policy="window:recent=8")
    assert own.token_ids == plain.token_ids[:16]
    with pytest.raises(ValueError, match="vocabulary"):
        smollm2.generate(prompt, max_tokens=4, draft_model=stories)
    with pytest.raises(ValueError, match="draft_policy needs a draft_model"):
        smollm2.generate(prompt, max_tokens=4, draft_policy="full")


def cli_binary():
    p = os.environ.get("KVSLIM_BIN") or str(REPO / "target" / "release" / "kvslim")
    return p if os.path.exists(p) else None


@pytest.mark.skipif(cli_binary() is None, reason="no kvslim binary (cargo build --release, or KVSLIM_BIN)")
@pytest.mark.parametrize("policy", ["full", "h2o:heavy=4,recent=4"])
def test_generate_equals_cli(smollm2, policy):
    model = str(shared("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = [cli_binary(), "generate", "-m", model, "-p", PROMPT, "--max-tokens", "16", "--policy", policy, "--json"]
    cli = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    g = smollm2.generate(PROMPT, max_tokens=16, policy=policy)
    assert (g.token_ids, g.text, g.policy) == (cli["token_ids"], cli["text"], cli["policy"])


def test_cli_perplexity_equals_python(smollm2, ids96, h2o96, tmp_path):
    if cli_binary() is None:
        pytest.skip("no kvslim binary (cargo build --release, or KVSLIM_BIN)")
    model = str(shared("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"))
    kept = tmp_path / "kept.json"
    args = [cli_binary(), "perplexity", "-m", model, "--tokens", ",".join(map(str, ids96)), "--policy", H2O]
    args += ["--compare-full", "--json", "--per-token", "--kept-out", str(kept)]
    cli = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    assert cli["logprobs"] == h2o96.logprobs.tolist()
    assert cli["compare_full"]["kl_mean"] == h2o96.kl
    assert [[h.tolist() for h in layer] for layer in h2o96.kept] == [
        layer["kv_heads"] for layer in json.loads(kept.read_text())["layers"]
    ]


def test_policy_changes_logprobs(full96, h2o96, smollm2):
    c = smollm2.config
    assert h2o96.policy == H2O and h2o96.budget_slots == 32
    assert h2o96.kl > 0 and 0 < h2o96.top1 < 1
    assert h2o96.full_nll == pytest.approx(full96.nll, abs=1e-9)
    assert not np.allclose(h2o96.logprobs, full96.logprobs)
    # the first 32 tokens fit the budget: identical log-probs there
    np.testing.assert_array_equal(h2o96.logprobs[:32], full96.logprobs[:32])
    assert h2o96.kv_bytes_peak < full96.kv_bytes_peak
    assert len(h2o96.kept) == c["n_layers"] and all(len(l) == c["n_kv_heads"] for l in h2o96.kept)
    last = len(h2o96.token_ids) - 2  # the last token is scored, never fed
    for layer, scores in zip(h2o96.kept, h2o96.scores):
        for kept, s in zip(layer, scores):
            assert len(kept) == 32 and kept.shape == s.shape
            assert np.all(np.diff(kept) > 0) and kept[-1] == last
            # the 16 most recent positions are the window
            np.testing.assert_array_equal(kept[-16:], np.arange(last - 15, last + 1))
            assert np.all(np.isfinite(s)) and np.all(s >= 0)
    # the full cache keeps every fed position
    for layer in full96.kept:
        for kept in layer:
            np.testing.assert_array_equal(kept, np.arange(len(full96.token_ids) - 1))


def test_bad_input_raises():
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        kvslim.Model("/no-such-model.gguf")
    with pytest.raises(ValueError, match="unknown policy `bogus`"):
        kvslim.normalize_policy("bogus")
    with pytest.raises(ValueError, match="heavy"):
        kvslim.normalize_policy("h2o:heavy=x")
    with pytest.raises(ValueError):
        kvslim.normalize_policy("chai:plan=/no/such/plan.json")


def test_bad_requests_raise(smollm2):
    with pytest.raises(ValueError, match="unknown policy"):
        smollm2.perplexity("Hello there", policy="bogus")
    with pytest.raises(ValueError, match="unknown policy"):
        smollm2.generate("Hello", policy="bogus")
    with pytest.raises(ValueError, match="at least 2 tokens"):
        smollm2.perplexity(tokens=[42])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smollm2.perplexity(tokens=[1, 10**6])
    with pytest.raises(ValueError, match="not both"):
        smollm2.perplexity("a b", tokens=[1, 2])
    with pytest.raises(ValueError, match="decisions_from"):
        smollm2.perplexity("a b c", policy="h2o:heavy=2,recent=2", decisions_from="q9")
    with pytest.raises(ValueError):
        smollm2.generate("Hello", temperature=-1.0)


def test_sampling_is_seeded(smollm2):
    a = smollm2.generate("Once upon a time", max_tokens=12, temperature=1.0, seed=7)
    b = smollm2.generate("Once upon a time", max_tokens=12, temperature=1.0, seed=7)
    greedy = smollm2.generate("Once upon a time", max_tokens=12)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 12
    assert a.token_ids != greedy.token_ids


def test_engine_releases_the_gil(smollm2, ids96):
    ticks = ticks_while(lambda: smollm2.perplexity(tokens=ids96[:64], policy=H2O))
    # holding the GIL, the engine would leave this loop a handful of ticks
    assert ticks > 50, f"the main thread ran only {ticks} times while the engine worked"


def test_calibrate_gives_a_usable_plan(stories, tmp_path):
    text = shared("data/tinystories/tinystories_val.txt").read_text()[:20000]
    plan = stories.calibrate(text, tmp_path / "plan.json", samples=8, seq_len=32)
    c = stories.config
    assert os.path.exists(plan.path) and len(plan.ks) == c["n_layers"]
    assert all(1 <= k <= c["n_heads"] for k in plan.ks)
    assert plan.plan["samples"] == 8 and plan.plan["probe"] == 5
    r = stories.perplexity(text, policy=plan.policy(static=True), max_tokens=64)
    clusters = [len(layer["clusters"]) for layer in r.report["chai_clusters"]]
    assert clusters == plan.ks
    h = stories.perplexity(text, policy=plan.policy("h2o:heavy=8,recent=8"), max_tokens=64)
    assert h.kl > 0 and h.budget_slots == 16
    with pytest.raises(ValueError, match="fewer than one window"):
        stories.calibrate("Once upon a time", tmp_path / "short.json", seq_len=64)
    with pytest.raises(FileNotFoundError, match="cannot write"):
        stories.calibrate(text, tmp_path / "no-such-dir" / "plan.json", samples=1, seq_len=32)


def test_eval_returns_flat_rows(stories, tmp_path):
    text = shared("data/tinystories/tinystories_val.txt")
    rows = kvslim.eval(
        stories, f"ppl:{text},seq_len=64", policies="full;h2o", budgets=["25%", "50%"], limit=2, out=tmp_path
    )
    assert [(r["policy"], r["budget"]) for r in rows] == [("full", "-"), ("h2o", "25%"), ("h2o", "50%")]
    for r in rows:
        assert r["items"] == 2 and r["tokens"] == 2 * 63
        assert all(v is None or isinstance(v, (str, int, float)) for v in r.values()), r
    full, h25, h50 = rows
    assert full["kl"] == 0 and full["top1"] == 1
    assert h25["kl"] > h50["kl"] > 0 and h25["kv_bytes"] < h50["kv_bytes"] < full["kv_bytes"]
    assert os.path.exists(next(iter(tmp_path.iterdir())) / "results.jsonl")
    try:
        import pandas
    except ImportError:
        return
    df = pandas.DataFrame(rows)
    assert list(df["policy"]) == ["full", "h2o", "h2o"] and df["nll"].notna().all()


def test_eval_bad_specs_raise(stories):
    with pytest.raises(ValueError, match="task spec"):
        kvslim.eval(stories, "nosuchkind:x", policies="full")
    with pytest.raises(ValueError):
        kvslim.eval(stories, "ppl:/dev/null", policies="h2o", budgets="lots")
    with pytest.raises(FileNotFoundError):
        kvslim.eval(stories, "ppl:/no/such/file.txt", policies="full")
