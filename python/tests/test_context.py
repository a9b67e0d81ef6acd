"""Compress once, ask many: `Model.compress`, `Context.generate`,
`Context.save` / `Model.load_context` (the engine's
`kvslim_engine::context`, as `kvslim compress` and `generate --context`
use it)."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest

import kvslim
from conftest import REPO, SMOLLM2, shared, ticks_while

H2O = "h2o:heavy=6.25%,recent=6.25%"  # 12.5% of the context kept
QUESTION = " In summary, the article says that"
SMALL = "h2o:heavy=8,recent=8"


@pytest.fixture(scope="module")
def document(smollm2) -> str:
    """About 1,000 tokens of WikiText-2 (whole lines)."""
    lines = shared("data/wikitext2/wiki.test.raw").read_text().splitlines(keepends=True)
    text = ""
    for line in lines:
        if len(smollm2.tokenize(text + line)) > 1000:
            break
        text += line
    return text


@pytest.fixture(scope="module")
def h2o_ctx(smollm2, document) -> kvslim.Context:
    return smollm2.compress(document, policy=H2O)


@pytest.fixture(scope="module")
def full_ctx(smollm2, document) -> kvslim.Context:
    return smollm2.compress(document)


@pytest.fixture(scope="module")
def small_ctx(smollm2) -> kvslim.Context:
    """A short context, cheap to save many times."""
    return smollm2.compress("The quick brown fox jumps over the lazy dog. " * 8, policy=SMALL)


def test_context_properties(smollm2, document, h2o_ctx, full_ctx):
    n = len(smollm2.tokenize(document))
    assert 900 <= n <= 1000
    for ctx in (h2o_ctx, full_ctx):
        assert ctx.tokens == len(ctx) == n and ctx.token_ids == smollm2.tokenize(document)
        assert ctx.model is smollm2 and not ctx.chat
        assert ctx.compress_seconds is not None and ctx.compress_seconds > 0
        assert ctx.kv_metadata_bytes > 0
    assert h2o_ctx.policy == kvslim.normalize_policy(H2O) and full_ctx.policy == "full"
    assert h2o_ctx.kv_bytes_full == full_ctx.kv_bytes_full
    # 12.5% of the tokens kept: at most 13% of the full cache's K/V bytes
    ratio = h2o_ctx.kv_bytes / h2o_ctx.kv_bytes_full
    print(f"{n} tokens: K/V {h2o_ctx.kv_bytes} of {h2o_ctx.kv_bytes_full} bytes ({100 * ratio:.2f}%)")
    assert ratio <= 0.13
    assert full_ctx.kv_bytes >= full_ctx.kv_bytes_full
    assert "tokens under" in repr(h2o_ctx)


@pytest.mark.parametrize("which", ["h2o", "full"])
def test_context_answers_repeat(which, h2o_ctx, full_ctx):
    ctx = h2o_ctx if which == "h2o" else full_ctx
    a = ctx.generate(QUESTION, max_tokens=16)
    b = ctx.generate(QUESTION, max_tokens=16)
    assert a.token_ids == b.token_ids and a.text == b.text and len(a.token_ids) > 0
    assert isinstance(a, kvslim.Generation) and a.policy == ctx.policy and a.speculative is None
    assert a.question_token_ids and a.prompt_token_ids == ctx.token_ids + a.question_token_ids
    assert a.kv_bytes_allocated > 0 and a.time_to_first_token_s > 0
    # the context is not changed by a question
    assert ctx.tokens == len(ctx.token_ids)


def test_h2o_context_differs_from_full(h2o_ctx, full_ctx):
    a = h2o_ctx.generate(QUESTION, max_tokens=16)
    b = full_ctx.generate(QUESTION, max_tokens=16)
    assert a.question_token_ids == b.question_token_ids
    assert a.kv_bytes_allocated < b.kv_bytes_allocated


def test_saved_context_answers_bit_identically(smollm2, h2o_ctx, full_ctx, tmp_path):
    for name, ctx in (("h2o", h2o_ctx), ("full", full_ctx)):
        p = tmp_path / f"{name}.kvctx"
        ctx.save(p)
        loaded = smollm2.load_context(p)
        assert loaded.compress_seconds is None and loaded.model is smollm2
        assert (loaded.tokens, loaded.token_ids, loaded.policy) == (ctx.tokens, ctx.token_ids, ctx.policy)
        assert (loaded.kv_bytes, loaded.kv_bytes_full, loaded.chat) == (ctx.kv_bytes, ctx.kv_bytes_full, ctx.chat)
        want = ctx.generate(QUESTION, max_tokens=24)
        got = loaded.generate(QUESTION, max_tokens=24)
        assert got.token_ids == want.token_ids and got.text == want.text, name
        # sampled answers too: the same seed, the same tokens
        s1 = ctx.generate(QUESTION, max_tokens=12, temperature=1.0, seed=3)
        s2 = loaded.generate(QUESTION, max_tokens=12, temperature=1.0, seed=3)
        assert s1.token_ids == s2.token_ids, name
        # saved again, the same bytes
        again = tmp_path / f"{name}-again.kvctx"
        loaded.save(str(again))
        assert again.read_bytes() == p.read_bytes()


def test_bad_context_files_raise(smollm2, stories, small_ctx, tmp_path):
    p = tmp_path / "ctx.kvctx"
    small_ctx.save(p)
    raw = p.read_bytes()
    assert smollm2.load_context(p).token_ids == small_ctx.token_ids

    cut = tmp_path / "truncated.kvctx"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="truncated"):
        smollm2.load_context(cut)

    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0x40
    bad = tmp_path / "corrupted.kvctx"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="checksum"):
        smollm2.load_context(bad)

    version = bytearray(raw)
    version[8:12] = (99).to_bytes(4, "little")
    v = tmp_path / "version.kvctx"
    v.write_bytes(bytes(version))
    with pytest.raises(ValueError, match="format version 99"):
        smollm2.load_context(v)

    junk = tmp_path / "junk.kvctx"
    junk.write_bytes(b"not a context at all")
    with pytest.raises(ValueError, match="magic"):
        smollm2.load_context(junk)

    with pytest.raises(ValueError, match="made with model"):
        stories.load_context(p)
    with pytest.raises(FileNotFoundError):
        smollm2.load_context(tmp_path / "absent.kvctx")
    with pytest.raises(FileNotFoundError):
        small_ctx.save(tmp_path / "no-such-dir" / "ctx.kvctx")
    # the file that failed to save left nothing behind
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(
        ["ctx.kvctx", "truncated.kvctx", "corrupted.kvctx", "version.kvctx", "junk.kvctx"]
    )


def test_bad_compress_requests_raise(smollm2, small_ctx):
    with pytest.raises(ValueError, match="chat=True"):
        smollm2.compress("Some text.", system="Be brief.")
    with pytest.raises(ValueError, match="unknown policy"):
        smollm2.compress("Some text.", policy="bogus")
    with pytest.raises(ValueError, match="empty"):
        smollm2.compress("")
    with pytest.raises(ValueError, match="empty"):
        small_ctx.generate("")
    with pytest.raises(ValueError):
        small_ctx.generate(" more", temperature=-1.0)


def test_chat_context_takes_questions_as_user_turns(smollm2):
    doc = "The capital of the small island nation of Zembla is Port Arno."
    question = "What is the capital of Zembla?"
    ctx = smollm2.compress(doc, chat=True, system="You answer in one short sentence.")
    assert ctx.chat and ctx.policy == "full"
    # the template's turns (detokenize drops the special tokens that mark them)
    assert smollm2.detokenize(ctx.token_ids) == f"system\nYou answer in one short sentence.\nuser\n{doc}\n"
    assert ctx.tokens > len(smollm2.tokenize(doc)) + 8
    g = ctx.generate(question, max_tokens=24)
    # the question is the next user turn, and the assistant's reply is opened
    assert smollm2.detokenize(g.question_token_ids) == f"user\n{question}\nassistant\n"
    print(f"chat answer: {g.text!r} ({g.stop_reason})")
    assert "Port Arno" in g.text
    # `<|im_end|>` is a stop id: the reply ends with its turn
    assert g.stop_reason == "eos" and len(g.token_ids) < 24
    # the same question as chat messages
    m = ctx.generate([{"role": "user", "content": question}], max_tokens=24)
    assert m.token_ids == g.token_ids and m.question_token_ids == g.question_token_ids
    other = ctx.generate("Which nation is Port Arno the capital of?", max_tokens=24)
    print(f"chat answer: {other.text!r}")
    assert other.token_ids != g.token_ids


def test_chat_context_round_trips(smollm2, tmp_path):
    ctx = smollm2.compress("The meeting is on Tuesday at 10am in room 4.", policy=SMALL, chat=True)
    ctx.save(tmp_path / "chat.kvctx")
    loaded = smollm2.load_context(tmp_path / "chat.kvctx")
    assert loaded.chat
    a = ctx.generate("When is the meeting?", max_tokens=16)
    b = loaded.generate("When is the meeting?", max_tokens=16)
    assert a.question_token_ids == b.question_token_ids and a.token_ids == b.token_ids


def test_context_generate_releases_the_gil(full_ctx):
    # the properties do not wait for the question
    ticks = ticks_while(
        lambda: full_ctx.generate(QUESTION, max_tokens=24), lambda: (full_ctx.tokens, full_ctx.policy)
    )
    assert ticks > 20, f"the main thread ran only {ticks} times while the engine worked"


def test_threads_share_a_context(h2o_ctx):
    want = h2o_ctx.generate(QUESTION, max_tokens=12).token_ids
    got = [None] * 3

    def ask(i):
        got[i] = h2o_ctx.generate(QUESTION, max_tokens=12).token_ids

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want] * 3


def cli_binary():
    p = os.environ.get("KVSLIM_BIN") or str(REPO / "target" / "release" / "kvslim")
    return p if os.path.exists(p) else None


def test_saved_context_loads_in_the_cli(smollm2, small_ctx, tmp_path):
    if cli_binary() is None:
        pytest.skip("no kvslim binary (cargo build --release, or KVSLIM_BIN)")
    p = tmp_path / "ctx.kvctx"
    small_ctx.save(p)
    args = [cli_binary(), "generate", "-m", str(shared(SMOLLM2)), "--context", str(p)]
    args += ["-p", QUESTION, "--max-tokens", "12", "--json"]
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0 and "--context" in run.stderr:
        pytest.skip(f"this kvslim binary has no --context: {run.stderr.strip()[:200]}")
    assert run.returncode == 0, run.stderr
    cli = json.loads(run.stdout)
    g = small_ctx.generate(QUESTION, max_tokens=12)
    assert (cli["token_ids"], cli["question_token_ids"], cli["policy"]) == (
        g.token_ids,
        g.question_token_ids,
        g.policy,
    )
    assert os.path.getsize(p) > 0
