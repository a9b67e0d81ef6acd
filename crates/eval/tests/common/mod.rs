//! Helpers shared by the evaluation tests. The tests need `../shared`
//! (or `KVSLIM_SHARED`): a missing file fails the test with its path rather
//! than skipping it.
#![allow(dead_code)] // each test crate uses its own subset

use kvslim_models::{load_model, LoadedModel};
use std::path::PathBuf;

#[path = "../../../../testing/shared_dir.rs"]
mod shared_dir;
pub use shared_dir::shared as shared_dir;

/// `../shared/data/REL`, which must exist.
pub fn data(rel: &str) -> PathBuf {
    let p = shared_dir().join("data").join(rel);
    assert!(p.exists(), "{} is absent: the tests need ../shared (or KVSLIM_SHARED)", p.display());
    p
}

/// The 260K-parameter TinyStories model.
pub fn stories() -> LoadedModel {
    let p = shared_dir().join("models/stories260K/stories260K.bin");
    assert!(p.exists(), "{} is absent: the tests need ../shared (or KVSLIM_SHARED)", p.display());
    load_model(&p).unwrap()
}
