#!/usr/bin/env python3
"""Drives a running `kvslim serve` with the official `openai` package and
checks the response shapes. Starts nothing itself.

    pip install openai
    python3 scripts/openai_client_check.py http://127.0.0.1:8080/v1

Exit status 0 when every check passes.
"""
import sys

from openai import OpenAI


def main() -> int:
    base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1"
    client = OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)

    models = client.models.list()
    model = models.data[0].id
    assert models.data[0].object == "model"

    # completions, non-streaming
    c = client.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0)
    assert c.object == "text_completion"
    assert isinstance(c.choices[0].text, str) and c.choices[0].text
    assert c.choices[0].finish_reason in ("stop", "length")
    assert c.usage.prompt_tokens > 0 and c.usage.completion_tokens > 0
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
    assert (c.usage.model_extra or {}).get("kv_bytes_allocated", 0) > 0

    # completions, streaming: same greedy text
    pieces = []
    finish = None
    for chunk in client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=16, temperature=0, stream=True
    ):
        pieces.append(chunk.choices[0].text)
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == c.choices[0].text, ("".join(pieces), c.choices[0].text)
    assert finish in ("stop", "length")

    # per-request KV policy (extension field)
    h = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=16, temperature=0,
        extra_body={"kv_policy": "h2o:heavy=8,recent=8"},
    )
    assert h.choices[0].text

    # chat, non-streaming
    msgs = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me a story."}]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0.7, top_p=0.9, seed=1)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert r.usage.completion_tokens > 0

    # chat, streaming, same seed → same text
    text = []
    roles = []
    for chunk in client.chat.completions.create(
        model=model, messages=msgs, max_tokens=24, temperature=0.7, top_p=0.9, seed=1, stream=True
    ):
        assert chunk.object == "chat.completion.chunk"
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
        if d.content:
            text.append(d.content)
    assert roles == ["assistant"], roles
    assert "".join(text) == r.choices[0].message.content

    # log-probs with echo (what lm-evaluation-harness sends): the prompt is
    # scored, its first token has no log-prob, max_tokens 0 generates nothing
    e = client.completions.create(model=model, prompt="Once upon a time", max_tokens=0, echo=True, logprobs=2)
    lp = e.choices[0].logprobs
    assert e.choices[0].text == "Once upon a time"
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert len(lp.tokens) == e.usage.prompt_tokens and e.usage.completion_tokens == 0
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(t) >= 2 for t in lp.top_logprobs[1:])
    g = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=1)
    glp = g.choices[0].logprobs
    assert all(tl == max(top.values()) for tl, top in zip(glp.token_logprobs, glp.top_logprobs))

    # several prompts and n samples: one choice per (prompt, sample)
    b = client.completions.create(model=model, prompt=["Once upon a time", "The dog"], n=2, max_tokens=4, seed=3)
    assert sorted(ch.index for ch in b.choices) == [0, 1, 2, 3]

    # chat log-probs in OpenAI's chat shape
    lr = client.chat.completions.create(
        model=model, messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    content = lr.choices[0].logprobs.content
    assert content and all(len(t.top_logprobs) == 2 for t in content)
    assert all(t.logprob == t.top_logprobs[0].logprob and isinstance(t.bytes, list) for t in content)
    streamed = []
    for chunk in client.chat.completions.create(
        model=model, messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2, stream=True
    ):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            streamed.extend(t.token for t in chunk.choices[0].logprobs.content)
    assert streamed == [t.token for t in content], (streamed, [t.token for t in content])

    # errors come back as OpenAI errors
    try:
        client.completions.create(model=model, prompt="hi", max_tokens=4, extra_body={"kv_policy": "nope"})
        raise AssertionError("invalid kv_policy accepted")
    except Exception as e:  # openai.BadRequestError
        assert getattr(e, "status_code", None) == 400, e
    try:
        client.completions.create(model=model, prompt="hi", max_tokens=-1)
        raise AssertionError("negative max_tokens accepted")
    except Exception as e:
        assert getattr(e, "status_code", None) == 400, e

    try:
        client.completions.create(model=model, prompt="hi", max_tokens=4, logprobs=6)
        raise AssertionError("logprobs above 5 accepted")
    except Exception as e:
        assert getattr(e, "status_code", None) == 400, e

    print(f"openai client check: all passed against {base} (model {model})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
