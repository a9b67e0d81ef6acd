#!/usr/bin/env python3
"""Regenerates crates/models/tests/fixtures/chat_templates.json: chat templates
rendered by Hugging Face transformers' `apply_chat_template`, the reference
that kvslim's minijinja renderer (crates/models/src/chat.rs) must match byte
for byte.

Templates: SmolLM2's is read from the GGUF metadata key
`tokenizer.chat_template`; the others are the `.jinja` files beside this
script (copies of the `chat_template` strings of the models' published
tokenizer_config.json files). No hub access is needed: the tokenizer object is
a tiny local one that only carries the template and the special tokens.

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install transformers jinja2 tokenizers
    /tmp/hfvenv/bin/python scripts/chat_template_fixtures.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
"""

import json
import struct
import sys
from pathlib import Path

import jinja2
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
GGUF = ROOT.parent / "shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = ROOT / "crates/models/tests/fixtures/chat_templates.json"
TEMPLATES = Path(__file__).resolve().parent / "chat_templates"


def gguf_string(path, wanted):
    """The string value of metadata key `wanted` in a GGUF file (v2/v3)."""
    with open(path, "rb") as f:
        magic, version, _n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        assert magic == b"GGUF" and version >= 2, "not a GGUF v2+ file"
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

        def read_str():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8")

        def skip(ty):
            if ty == 8:
                read_str()
            elif ty == 9:
                inner, count = struct.unpack("<IQ", f.read(12))
                for _ in range(count):
                    skip(inner)
            else:
                f.seek(sizes[ty], 1)

        for _ in range(n_kv):
            key = read_str()
            (ty,) = struct.unpack("<I", f.read(4))
            if key == wanted and ty == 8:
                return read_str()
            skip(ty)
    raise KeyError(wanted)


def render(template, bos, eos, messages, add_generation_prompt, tools=None, extra=None):
    """What transformers renders, or the exception text when the template raises."""
    vocab = {t: i for i, t in enumerate(dict.fromkeys(["<unk>", bos, eos]))}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        bos_token=bos,
        eos_token=eos,
        unk_token="<unk>",
        chat_template=template,
    )
    try:
        text = tok.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **(extra or {})
        )
        return {"expected": text}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}


SYSTEM_USER = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is 2+2?"},
]
USER_ONLY = [{"role": "user", "content": "Hello!"}]
MULTI_TURN = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another one?"},
]
SPECIAL = [
    {"role": "user", "content": "  Line one\nline \"two\" with 'quotes' & <tags>\n\ttab, {{ braces }} {% raw %}, ünïcødé ✓ 日本  \n"},
]
SYSTEM_FIRST_FULL = [
    {"role": "system", "content": "Sys."},
    {"role": "user", "content": "Q1"},
    {"role": "assistant", "content": "A1"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "content": "A2"},
]
BAD_ORDER = [
    {"role": "user", "content": "one"},
    {"role": "user", "content": "two"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city, with \"quotes\" and ünïcødé.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1}},
                "required": ["city"],
            },
        },
    }
]
TOOL_TURN = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}],
    },
    {"role": "tool", "content": "{\"temp\": 21.5}"},
]


def main():
    gguf = Path(sys.argv[1]) if len(sys.argv) > 1 else GGUF
    families = [
        ("smollm2", gguf_string(gguf, "tokenizer.chat_template"), "<|im_start|>", "<|im_end|>"),
        ("qwen2.5-instruct", (TEMPLATES / "qwen2.5-instruct.jinja").read_text(), "<|endoftext|>", "<|im_end|>"),
        ("gemma-2-it", (TEMPLATES / "gemma-2-it.jinja").read_text(), "<bos>", "<eos>"),
        ("llama-3.2-instruct", (TEMPLATES / "llama-3.2-instruct.jinja").read_text(), "<|begin_of_text|>", "<|eot_id|>"),
    ]
    conversations = [
        ("system+user", SYSTEM_USER),
        ("user only", USER_ONLY),
        ("multi-turn", MULTI_TURN),
        ("special characters", SPECIAL),
        ("system + two full turns", SYSTEM_FIRST_FULL),
        ("roles out of order", BAD_ORDER),
    ]
    cases = []
    for name, template, bos, eos in families:
        # Llama 3.2 prints today's date unless `date_string` is given
        extra = {"date_string": "26 Jul 2024"} if name.startswith("llama") else None
        for conv_name, messages in conversations:
            for gen in (True, False):
                case = {"family": name, "name": f"{conv_name}, add_generation_prompt={gen}", "messages": messages,
                        "add_generation_prompt": gen}
                if extra:
                    case["extra"] = extra
                case.update(render(template, bos, eos, messages, gen, extra=extra))
                cases.append(case)
        if name in ("qwen2.5-instruct", "llama-3.2-instruct"):
            for conv_name, messages in [("tools", USER_ONLY), ("tool call and result", TOOL_TURN)]:
                case = {"family": name, "name": conv_name, "messages": messages, "add_generation_prompt": True,
                        "tools": TOOLS}
                if extra:
                    case["extra"] = extra
                case.update(render(template, bos, eos, messages, True, tools=TOOLS, extra=extra))
                cases.append(case)
    out = {
        "generated_by": f"scripts/chat_template_fixtures.py with transformers {transformers.__version__}, "
                        f"jinja2 {jinja2.__version__}",
        "templates": {name: {"template": t, "bos_token": b, "eos_token": e} for name, t, b, e in families},
        "cases": cases,
    }
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"{OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
