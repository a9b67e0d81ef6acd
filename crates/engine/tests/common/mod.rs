//! Helpers shared by the engine's integration tests: where `../shared` is,
//! and the stories260K model and text most tests run on.
#![allow(dead_code)] // each test crate uses its own subset

use kvslim_cache::SequenceCache;
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

/// Asserts two caches are the same bit for bit: positions, scores, K/V
/// rows, bytes and the next position.
pub fn assert_same_cache(a: &SequenceCache, b: &SequenceCache, what: &str) {
    assert_eq!(a.next_pos(), b.next_pos(), "{what}: next_pos");
    let (x, y) = (a.store().bytes(), b.store().bytes());
    assert_eq!(x.kv, y.kv, "{what}: K/V bytes");
    // a paged store's tables grow by amortised pushes, so their capacity
    // follows the history; fixed slots allocate all metadata at creation
    if a.store().page_counts().is_none() {
        assert_eq!(x.metadata, y.metadata, "{what}: metadata bytes");
    }
    for l in 0..a.store().layers() {
        for h in 0..a.store().kv_heads() {
            let (x, y) = (a.store().head(l, h), b.store().head(l, h));
            assert_eq!(x.positions(), y.positions(), "{what}: positions layer {l} head {h}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let owned_bits = |v: Vec<f32>| bits(&v);
            assert_eq!(bits(x.scores()), bits(y.scores()), "{what}: scores layer {l} head {h}");
            assert_eq!(x.decoded_keys().map(owned_bits), y.decoded_keys().map(owned_bits), "{what}: keys {l}/{h}");
            assert_eq!(bits(&x.decoded_values()), bits(&y.decoded_values()), "{what}: values layer {l} head {h}");
        }
    }
}

/// Writes a CHAI plan keeping `ks[l]` clusters in layer `l` of a model
/// with `heads` query heads (head errors falling with the index); returns
/// its path (`name` keeps plans of one test process apart).
pub fn chai_plan(name: &str, heads: usize, ks: &[usize]) -> String {
    let errors: Vec<f64> = (0..heads).map(|i| (heads - i) as f64).collect();
    let layers: Vec<_> = ks.iter().map(|&k| serde_json::json!({ "k": k, "errors": errors })).collect();
    test_file(&format!("chai-{name}.json"), &serde_json::json!({ "layers": layers }).to_string())
}

/// Writes a test's input file under the temp folder at a fixed name (no
/// process id, so repeated runs replace their files instead of piling
/// them up) and returns its path. The write goes to a process-private
/// name first and is renamed into place: a test run beside another one
/// never reads half a file (both write the same bytes for the same name).
pub fn test_file(name: &str, contents: &str) -> String {
    let dir = std::env::temp_dir().join("kvslim-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path.display().to_string()
}
