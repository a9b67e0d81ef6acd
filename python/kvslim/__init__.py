"""kvslim from Python: load a model, generate, score text under a KV-cache
policy (H2O, CHAI, …) and inspect what the policy kept.

>>> import kvslim
>>> m = kvslim.Model("smollm2-135m")
>>> r = m.perplexity("The quick brown fox …", policy="h2o:heavy=32,recent=32")
>>> r.nll, r.kl, r.logprobs[:5], r.kept[0][0]
>>> ctx = m.compress(open("report.txt").read(), policy="h2o:heavy=6.25%,recent=6.25%", chat=True)
>>> ctx.generate("Who wrote the report?").text  # each question on a fork of the compressed cache

The engine is Rust (``kvslim._native``); this module turns its results into
dataclasses and numpy arrays. Engine calls release the GIL.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._native import aliases, normalize_policy, set_threads

__version__: str = _native.__version__

__all__ = [
    "Model",
    "Context",
    "Generation",
    "PerplexityResult",
    "CalibrationPlan",
    "eval",
    "aliases",
    "normalize_policy",
    "set_threads",
]


@dataclass(frozen=True)
class Generation:
    """One generated continuation (``str(g)`` is its text)."""

    text: str
    token_ids: List[int]
    prompt_token_ids: List[int]
    stop_reason: str
    policy: str
    time_to_first_token_s: float
    decode_s: float
    kv_bytes_allocated: int
    kv_metadata_bytes: int
    #: ``{"target_passes", "drafted", "accepted", "replays"}`` of a
    #: speculative run, else ``None``.
    speculative: Optional[Dict[str, int]] = None
    #: An answer on a :class:`Context`: the question's tokens (then
    #: ``prompt_token_ids`` is the context's tokens followed by these), else
    #: ``None``.
    question_token_ids: Optional[List[int]] = None

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, eq=False)  # numpy fields: no element-wise __eq__
class PerplexityResult:
    """Teacher-forced scoring of one sequence under one policy.

    ``logprobs[i]`` is ln p(token_ids[i+1] | token_ids[:i+1]). ``kept[l][h]``
    holds the positions KV head ``h`` of layer ``l`` retained after the last
    token (ascending) and ``scores[l][h]`` their accumulated attention scores.
    ``kl``, ``top1`` and ``full_nll`` compare with the full cache on the same
    tokens (``None`` when the comparison was not run).
    """

    policy: str
    token_ids: np.ndarray
    logprobs: np.ndarray
    nll: float
    ppl: float
    kl: Optional[float]
    top1: Optional[float]
    full_nll: Optional[float]
    retained_mass: Optional[float]
    budget_slots: Optional[int]
    kv_bytes_allocated: int
    kv_bytes_peak: int
    kept: List[List[np.ndarray]]
    scores: List[List[np.ndarray]]
    report: Dict[str, Any] = field(repr=False)
    """The CLI's ``kvslim perplexity --json`` object (every statistic)."""


@dataclass(frozen=True)
class CalibrationPlan:
    """A CHAI plan written by :meth:`Model.calibrate`."""

    path: str
    plan: Dict[str, Any] = field(repr=False)

    @property
    def ks(self) -> List[int]:
        """Cluster count per layer."""
        return [layer["k"] for layer in self.plan["layers"]]

    def policy(self, token: Optional[str] = None, static: bool = False) -> str:
        """A policy spec using this plan, optionally after a token policy:
        ``plan.policy("h2o:heavy=32,recent=32")``."""
        head = f"{'chai-static' if static else 'chai'}:plan={self.path}"
        return f"{token}+{head}" if token else head


def _arrays(nested: List[List[List[Any]]], dtype: Any) -> List[List[np.ndarray]]:
    return [[np.asarray(h, dtype=dtype) for h in layer] for layer in nested]


class Model:
    """A model: a path (HF directory, ``.gguf``, llama2.c ``.bin``),
    ``hf:org/repo[/file]`` or an alias (``smollm2-135m``, ``stories260k``).
    ``tokenizer`` names a tokenizer file for models that carry none.
    ``f32_activations=True`` multiplies quantized weights (Q4_0, Q4_1,
    Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) with f32 activations, so results
    equal the dequantized model's to rounding; by default (AVX-512 VNNI
    CPUs) activations are quantized to 8 bits per block of 32, as llama.cpp
    does: faster, slightly less accurate.

    Raises ``FileNotFoundError`` when the model cannot be found and
    ``ValueError`` when its files cannot be read as a model.
    """

    def __init__(
        self,
        model: Union[str, os.PathLike[str]],
        tokenizer: Optional[Union[str, os.PathLike[str]]] = None,
        f32_activations: bool = False,
    ):
        self._m = _native.Model(
            os.fspath(model), None if tokenizer is None else os.fspath(tokenizer), f32_activations
        )

    def __repr__(self) -> str:
        return f"kvslim.Model({self.spec!r})"

    @property
    def spec(self) -> str:
        """What the model was loaded from."""
        return self._m.spec

    @property
    def path(self) -> str:
        """The resolved local path."""
        return os.fspath(self._m.path)

    @property
    def config(self) -> Dict[str, int]:
        """Layers, heads, KV heads, head size, vocabulary, context."""
        return self._m.config

    def tokenize(self, text: str) -> List[int]:
        """Token ids of ``text`` (BOS as the tokenizer says)."""
        return self._m.tokenize(text)

    def detokenize(self, ids: Iterable[int]) -> str:
        """Text of token ids."""
        return self._m.detokenize([int(i) for i in ids])

    def generate(
        self,
        prompt: str,
        max_tokens: int = 128,
        policy: str = "full",
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        speculative: bool = False,
        draft_model: Optional["Model"] = None,
        draft_policy: Optional[str] = None,
    ) -> Generation:
        """Continues ``prompt`` (greedy at temperature 0) with the KV cache
        under ``policy``; stops at EOS or after ``max_tokens``.

        ``speculative`` (greedy only): n-gram drafts copied from the prompt
        and output, verified in one pass each (``generate --speculative
        ngram``): the same tokens, faster on answers that copy their prompt.
        ``draft_model`` (greedy only; a :class:`Model` with this one's
        vocabulary, e.g. ``qwen2.5-coder-0.5b`` for ``qwen2.5-coder-1.5b``):
        copies where the context matches, else drafts by the draft model
        under ``draft_policy`` (default: ``policy``), as ``generate
        --draft-model``: the same tokens again.
        """
        draft = draft_model._m if draft_model is not None else None
        d = self._m.generate(prompt, max_tokens, policy, temperature, top_k, top_p, seed, speculative, draft,
                             draft_policy)
        return Generation(**d)

    def perplexity(
        self,
        text: Optional[str] = None,
        *,
        tokens: Optional[Sequence[int]] = None,
        policy: str = "full",
        max_tokens: Optional[int] = None,
        prefill: int = 0,
        compare_full: Optional[bool] = None,
        decisions_from: Optional[str] = None,
    ) -> PerplexityResult:
        """Scores ``text`` (or ``tokens``) teacher-forced under ``policy``,
        every token a decode step after the first ``prefill`` tokens.

        ``max_tokens`` keeps only the first tokens. ``compare_full`` (default:
        on unless the policy is plain ``full``) also runs the full cache and
        fills ``kl``, ``top1`` and ``full_nll``.
        """
        if compare_full is None:
            compare_full = normalize_policy(policy) != "full"
        ids = None if tokens is None else [int(t) for t in tokens]
        d = self._m.perplexity(text, ids, policy, max_tokens, prefill, compare_full, decisions_from)
        token_ids = np.asarray(d.pop("token_ids"), dtype=np.int64)
        logprobs = np.asarray(d.pop("logprobs"), dtype=np.float64)
        kept = _arrays(d.pop("kept"), np.int64)
        scores = _arrays(d.pop("kept_scores"), np.float32)
        cmp = d.get("compare_full") or {}
        mass = cmp.get("retained_mass")
        return PerplexityResult(
            policy=d["policy"],
            token_ids=token_ids,
            logprobs=logprobs,
            nll=d["nll"],
            ppl=d["ppl"],
            kl=cmp.get("kl_mean"),
            top1=cmp.get("top1_agreement"),
            full_nll=cmp.get("full_nll"),
            retained_mass=None if mass is None else mass["mean"],
            budget_slots=d.get("budget_slots"),
            kv_bytes_allocated=d["kv_bytes_allocated"],
            kv_bytes_peak=d["kv_bytes_peak"],
            kept=kept,
            scores=scores,
            report=d,
        )

    def calibrate(
        self,
        text: str,
        out: Optional[Union[str, os.PathLike[str]]] = None,
        *,
        samples: int = 64,
        seq_len: int = 128,
        probe: int = 5,
        max_k: int = 0,
        dense_layers: int = 0,
        restarts: int = 10,
        seed: int = 0,
    ) -> CalibrationPlan:
        """CHAI's offline calibration on ``text``: clusters every layer's
        heads on their probe attention and writes the plan to ``out`` (a
        fresh temporary file when omitted). ``plan.policy()`` gives a spec
        that uses it."""
        if out is None:
            fd, out = tempfile.mkstemp(prefix="kvslim-chai-", suffix=".json")
            os.close(fd)
        path = os.fspath(out)
        plan = self._m.calibrate(text, path, samples, seq_len, probe, max_k, dense_layers, restarts, seed)
        return CalibrationPlan(path=path, plan=plan)

    def compress(
        self, text: str, policy: str = "full", chat: bool = False, system: Optional[str] = None
    ) -> Context:
        """Prefills ``text`` once under ``policy`` and keeps the compressed
        cache (``kvslim compress``): each :meth:`Context.generate` then asks
        a question on a fork of it, without prefilling the text again.
        Percentage budgets resolve against the text's length.

        ``chat=True`` frames the text as the first user message of a chat
        (the model's chat template), after a ``system`` prompt if given, so
        that questions follow as user turns: what an instruction-tuned model
        answers best. Without it a question's text is appended to the text.
        """
        return Context(self, self._m.compress(text, policy, chat, system))

    def load_context(self, path: Union[str, os.PathLike[str]]) -> Context:
        """Reads a context written by :meth:`Context.save` (or ``kvslim
        compress -o``) for this model. ``ValueError`` says why a file does
        not load: truncated, corrupted (checksum), made with another model,
        another format version; ``FileNotFoundError`` when it is absent."""
        return Context(self, self._m.load_context(os.fspath(path)))


Question = Union[str, Sequence[Mapping[str, str]]]
"""A question: text (a chat context's next user turn), or chat messages
(``{"role": …, "content": …}`` dicts) that follow the context."""


class Context:
    """A text prefilled once under a KV policy and kept compressed
    (:meth:`Model.compress`, :meth:`Model.load_context`). Each
    :meth:`generate` answers on a fork: the policy keeps running while the
    question and answer go in, and the context itself never changes, so
    the same question gives the same tokens every time. Questions from
    several threads to one context run one at a time.
    """

    def __init__(self, model: Model, native: _native.Context):
        self._model = model
        self._c = native

    def __repr__(self) -> str:
        return f"<kvslim.Context {self.tokens} tokens under {self.policy!r}, chat={self.chat}>"

    def __len__(self) -> int:
        return self.tokens

    @property
    def model(self) -> Model:
        """The model the context belongs to."""
        return self._model

    @property
    def tokens(self) -> int:
        """How many tokens the context holds."""
        return self._c.tokens

    @property
    def token_ids(self) -> List[int]:
        """The context's token ids."""
        return self._c.token_ids

    @property
    def policy(self) -> str:
        """The policy it was compressed under (canonical spec); it keeps
        running on every question's fork."""
        return self._c.policy

    @property
    def chat(self) -> bool:
        """Whether the text was framed as a chat's first messages."""
        return self._c.chat

    @property
    def kv_bytes(self) -> int:
        """Allocated K/V bytes of the kept cache."""
        return self._c.kv_bytes

    @property
    def kv_metadata_bytes(self) -> int:
        """Position and score bytes beside the kept K/V."""
        return self._c.kv_metadata_bytes

    @property
    def kv_bytes_full(self) -> int:
        """K/V bytes the full cache would hold for the same tokens (same
        storage dtype): what ``kv_bytes`` compares with."""
        return self._c.kv_bytes_full

    @property
    def compress_seconds(self) -> Optional[float]:
        """Seconds :meth:`Model.compress` took (``None`` for a loaded context)."""
        return self._c.compress_seconds

    def generate(
        self,
        question: Question,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> Generation:
        """Answers ``question`` after the context (greedy at temperature 0),
        as ``kvslim generate --context``: a chat context takes a text
        question as its next user turn, rendered by the chat template; a
        text context takes it as text appended to its own. Stops at EOS,
        the chat's end-of-turn markers or after ``max_tokens``. The
        :class:`Generation`'s ``question_token_ids`` are what was fed after
        the context."""
        q: Union[str, List[Tuple[str, str]]]
        if isinstance(question, str):
            q = question
        else:
            q = [(m["role"], m["content"]) for m in question]
        d = self._c.generate(q, max_tokens, temperature, top_k, top_p, seed)
        return Generation(**d)

    def save(self, path: Union[str, os.PathLike[str]]) -> None:
        """Writes the context to ``path`` (``kvslim compress -o``'s format:
        the kept K/V rows in their dtype, positions, scores, policy state;
        checksummed), through a temporary file renamed into place.
        :meth:`Model.load_context` reads it back bit for bit."""
        self._c.save(os.fspath(path))


def _flatten(row: Dict[str, Any]) -> Dict[str, Any]:
    """One result row as a flat dict: metrics as columns, timings as
    ``time_<name>``. The per-item values behind paired comparisons
    (``per_item``) stay in results.jsonl."""
    out = {k: v for k, v in row.items() if k not in ("metrics", "timings", "per_item")}
    out.update({k: (float("nan") if v is None else v) for k, v in row["metrics"].items()})
    out.update({f"time_{k}": v for k, v in row["timings"].items()})
    return out


def _split(x: Union[str, Sequence[str]]) -> List[str]:
    items = x.split(";") if isinstance(x, str) else list(x)
    return [s.strip() for s in items if s.strip()]


def eval(
    models: Union[str, Model, Sequence[Union[str, Model]]],
    tasks: Union[str, Sequence[str]],
    policies: Union[str, Sequence[str]] = ("full", "window", "sink", "heavy", "random", "h2o"),
    budgets: Union[str, Sequence[str]] = ("100%", "40%", "20%", "10%", "5%"),
    *,
    limit: Optional[int] = None,
    seq_len: Optional[int] = None,
    mode: str = "decode",
    compare_full: bool = True,
    out: Optional[Union[str, os.PathLike[str]]] = None,
) -> List[Dict[str, Any]]:
    """``kvslim eval``: every model × task × policy family × budget.

    Tasks and policies use the CLI's grammar (``ppl:FILE,seq_len=N``,
    ``mc:FILE``, ``h2o``, ``h2o:agg=max``, …), as lists or ``;``-separated
    strings; budgets are percentages or slot counts. Returns one flat dict
    per cell (``model``, ``policy``, ``budget``, ``task``, ``items``, each
    metric as a key, timings as ``time_*``): ``pandas.DataFrame(rows)``
    makes the table. With ``out``, each model's results.jsonl/csv/md and
    plots are written to ``out/<n>-<model>`` as by the CLI.
    """
    if isinstance(models, (str, Model)):
        models = [models]
    policy_list = _split(policies)
    budget_list = [b.strip() for b in (budgets.split(",") if isinstance(budgets, str) else budgets)]
    task_list = _split(tasks)
    rows: List[Dict[str, Any]] = []
    for i, m in enumerate(models):
        model = m if isinstance(m, Model) else Model(m)
        out_dir = None
        if out is not None:
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.path.basename(model.spec))
            out_dir = os.path.join(os.fspath(out), f"{i}-{safe}")
        got = model._m.eval(
            task_list, policy_list, budget_list, model.spec, limit, seq_len, mode, compare_full, out_dir
        )
        rows.extend(_flatten(r) for r in got)
    return rows
