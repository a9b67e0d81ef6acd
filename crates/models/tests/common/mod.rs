//! Helpers shared by the model integration tests: locating `../shared`.
#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared` relative to the workspace root (or `KVSLIM_SHARED`).
pub fn shared() -> PathBuf {
    if let Ok(p) = std::env::var("KVSLIM_SHARED") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let p = root.join("../shared");
    assert!(p.exists(), "../shared not found beside the repository ({}); set KVSLIM_SHARED", p.display());
    p
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}
