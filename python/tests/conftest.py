"""Shared fixtures: the models and references in ../shared, found as the
Rust tests find them (testing/shared_dir.rs): $KVSLIM_SHARED, else
`shared/` beside the repository. A missing file fails the test that needs
it, naming the path (never a silent pass)."""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import kvslim

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("KVSLIM_SHARED") or REPO.parent / "shared")


def shared(rel: str) -> Path:
    p = SHARED / rel
    assert p.exists(), f"{p} is absent: the tests need ../shared (or KVSLIM_SHARED)"
    return p


def ticks_while(work: Callable[[], object], poll: Callable[[], object] = lambda: None) -> int:
    """Runs ``work`` on another thread and counts how often this thread runs
    (``poll``, then a 1 ms sleep) until it is done: an engine call that
    held the GIL would leave the count at a handful."""
    done = threading.Event()

    def run() -> None:
        try:
            work()
        finally:
            done.set()

    t = threading.Thread(target=run)
    t.start()
    ticks = 0
    while not done.is_set():
        ticks += 1
        poll()
        time.sleep(0.001)
    t.join()
    return ticks


def read_safetensors(path: Path) -> dict:
    """Every tensor of a safetensors file as a numpy array (the format is an
    8-byte header length, a JSON header, then the raw data)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    dtypes = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4"}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a : 8 + n + b], dtype=dtypes[t["dtype"]]).reshape(t["shape"])
    return out


SMOLLM2 = "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2() -> kvslim.Model:
    return kvslim.Model(shared(SMOLLM2))


@pytest.fixture(scope="session")
def smollm2_f32() -> kvslim.Model:
    """f32 activations: parity with transformers on the dequantized weights."""
    return kvslim.Model(shared(SMOLLM2), f32_activations=True)


@pytest.fixture(scope="session")
def stories() -> kvslim.Model:
    return kvslim.Model(shared("models/stories260K/stories260K.bin"))


@pytest.fixture(scope="session")
def smollm2_ref() -> dict:
    return read_safetensors(shared("fixtures/smollm2/reference.safetensors"))


@pytest.fixture(scope="session")
def smollm2_text() -> str:
    return shared("fixtures/smollm2/text.txt").read_text()
