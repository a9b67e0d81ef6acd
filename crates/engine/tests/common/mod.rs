//! Helpers shared by the engine's integration tests: where `../shared` is,
//! and the stories260K model and text most tests run on.
#![allow(dead_code)] // each test crate uses its own subset

use kvslim_models::{load_model, LoadedModel};

#[path = "../../../../testing/shared_dir.rs"]
mod shared_dir;
pub use shared_dir::shared;

pub fn stories() -> LoadedModel {
    load_model(&shared().join("models/stories260K/stories260K.bin")).unwrap()
}

/// The first `n` tokens of the TinyStories validation text.
pub fn tokens(m: &LoadedModel, n: usize) -> Vec<u32> {
    let text = std::fs::read_to_string(shared().join("data/tinystories/tinystories_val.txt")).unwrap();
    let end = text.char_indices().nth(8 * n).map_or(text.len(), |(i, _)| i);
    let mut ids = m.tokenizer.as_ref().unwrap().encode(&text[..end]).unwrap();
    assert!(ids.len() >= n, "need {n} tokens, text gave {}", ids.len());
    ids.truncate(n);
    ids
}
