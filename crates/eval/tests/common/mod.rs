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

/// The task spec `KIND:PATH,OPTIONS` on the data file `../shared/data/REL`.
pub fn task_on(kind: &str, rel: &str, options: &str) -> String {
    format!("{kind}:{},{options}", data(rel).display())
}

/// The 260K-parameter TinyStories model.
pub fn stories() -> LoadedModel {
    let p = shared_dir().join("models/stories260K/stories260K.bin");
    assert!(p.exists(), "{} is absent: the tests need ../shared (or KVSLIM_SHARED)", p.display());
    load_model(&p).unwrap()
}

/// A scratch folder `kvslim-eval-NAME-PID` under the temporary folder,
/// emptied when made and removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("kvslim-eval-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
