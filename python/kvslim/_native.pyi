"""Type stubs of the Rust extension ``kvslim._native`` (see ``src/lib.rs``)."""

from os import PathLike
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, final

__all__ = ["Model", "Context", "set_threads", "normalize_policy", "aliases", "__version__"]
__version__: str

@final
class Model:
    def __new__(
        cls, model: str, tokenizer: Optional[Union[str, PathLike[str]]] = None, f32_activations: bool = False
    ) -> Model: ...
    @property
    def spec(self) -> str: ...
    @property
    def path(self) -> PathLike[str]: ...
    @property
    def config(self) -> Dict[str, int]: ...
    def tokenize(self, text: str) -> List[int]: ...
    def detokenize(self, ids: Sequence[int]) -> str: ...
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
    ) -> Dict[str, Any]: ...
    def perplexity(
        self,
        text: Optional[str] = None,
        tokens: Optional[Sequence[int]] = None,
        policy: str = "full",
        max_tokens: Optional[int] = None,
        prefill: int = 0,
        compare_full: bool = False,
        decisions_from: Optional[str] = None,
    ) -> Dict[str, Any]: ...
    def calibrate(
        self,
        text: str,
        out: Union[str, PathLike[str]],
        samples: int = 64,
        seq_len: int = 128,
        probe: int = 5,
        max_k: int = 0,
        dense_layers: int = 0,
        restarts: int = 10,
        seed: int = 0,
    ) -> Dict[str, Any]: ...
    def eval(
        self,
        tasks: Sequence[str],
        policies: Sequence[str],
        budgets: Sequence[str],
        label: Optional[str] = None,
        limit: Optional[int] = None,
        seq_len: Optional[int] = None,
        mode: str = "decode",
        compare_full: bool = True,
        out: Optional[Union[str, PathLike[str]]] = None,
    ) -> List[Dict[str, Any]]: ...
    def compress(self, text: str, policy: str = "full", chat: bool = False, system: Optional[str] = None) -> Context: ...
    def load_context(self, path: Union[str, PathLike[str]]) -> Context: ...

@final
class Context:
    @property
    def model(self) -> Model: ...
    @property
    def tokens(self) -> int: ...
    @property
    def token_ids(self) -> List[int]: ...
    @property
    def policy(self) -> str: ...
    @property
    def chat(self) -> bool: ...
    @property
    def kv_bytes(self) -> int: ...
    @property
    def kv_metadata_bytes(self) -> int: ...
    @property
    def kv_bytes_full(self) -> int: ...
    @property
    def compress_seconds(self) -> Optional[float]: ...
    def generate(
        self,
        question: Union[str, Sequence[Tuple[str, str]]],
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> Dict[str, Any]: ...
    def save(self, path: Union[str, PathLike[str]]) -> None: ...

def set_threads(n: int) -> None: ...
def normalize_policy(spec: str) -> str: ...
def aliases() -> List[Tuple[str, str]]: ...
