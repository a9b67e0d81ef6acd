//! Tokenizers embedded in GGUF metadata (`tokenizer.ggml.*`).
