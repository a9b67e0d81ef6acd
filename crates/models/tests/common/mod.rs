//! Helpers shared by the model integration tests: locating `../shared`.
#![allow(dead_code)]

use std::path::PathBuf;

#[path = "../../../../testing/shared_dir.rs"]
mod shared_dir;

/// `../shared` (or `KVSLIM_SHARED`), which must exist.
pub fn shared() -> PathBuf {
    let p = shared_dir::shared();
    assert!(p.exists(), "../shared not found beside the repository ({}); set KVSLIM_SHARED", p.display());
    p
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}
