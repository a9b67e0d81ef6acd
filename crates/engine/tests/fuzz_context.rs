//! Mutation fuzzing of the compressed-context loader ([`Context::from_bytes`])
//! on real context files of a small model under several policies (full,
//! H2O, q8 and q4 rows, paged, random eviction with its RNG streams, AdaKV's
//! per-head shares): every input loads or gives a clear error, with no
//! panic, no hang and no allocation beyond a multiple of the input's size.
//! Two targets: the file as mutated (the checksum turns nearly every change
//! away at once), and the file with its checksum recomputed after the
//! mutation, so the header, the lengths and the cache's rows behind it are
//! what gets exercised. `KVSLIM_FUZZ_ITERS` sets the inputs per target
//! (see `testing/fuzz`); docs/contexts.md records the 10⁶-input run.

use kvslim_cache::PolicySpec;
use kvslim_engine::context::Context;
use kvslim_fuzz as fuzz;
use kvslim_kernels::DType;
use kvslim_models::config::ModelConfig;
use kvslim_models::Model;
use std::sync::{Arc, OnceLock};

fn model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| {
        let cfg = ModelConfig { context_len: 256, ..kvslim_engine::synthetic::llama_config(2, 32, 48, 4, 2, 8, 40) };
        Arc::new(kvslim_engine::synthetic::random_model(cfg, DType::F32, 7, 3.0).unwrap())
    })
    .clone()
}

/// Context files under several policies, each with the range of its
/// header (where mutations are most often aimed).
fn seeds() -> Vec<(Vec<u8>, std::ops::Range<usize>)> {
    let m = model();
    let tokens: Vec<u32> = (0..48u32).map(|i| (i * 7 + 3) % 40).collect();
    [
        "full",
        "h2o:heavy=8,recent=8",
        "h2o:heavy=8,recent=8,kv_dtype=q8,page=4",
        "window:recent=12,kv_dtype=q4",
        "random:budget=10,seed=2",
        "h2o:heavy=6,recent=6,alloc=ada:0.2",
    ]
    .iter()
    .map(|spec| {
        let ctx = Context::compress(&m, &PolicySpec::parse(spec).unwrap(), &tokens).unwrap();
        let bytes = ctx.to_bytes().unwrap();
        let header = 20 + u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize;
        (bytes, 0..header + 64)
    })
    .collect()
}

const LIMITS: fuzz::Limits =
    fuzz::Limits { per_input: std::time::Duration::from_secs(10), alloc_factor: 16, alloc_slack: 1 << 20 };

fn verdict(m: &Model, bytes: &[u8]) -> fuzz::Verdict {
    Context::from_bytes(m, bytes).map(|_| ()).map_err(|e| e.to_string())
}

#[test]
fn fuzz_context_file() {
    let m = model();
    fuzz::run_bytes("context-file", fuzz::iters(3_000), LIMITS, seeds(), move |d| verdict(&m, d));
}

#[test]
fn fuzz_context_behind_its_checksum() {
    let m = model();
    fuzz::run_bytes("context-checksummed", fuzz::iters(3_000), LIMITS, seeds(), move |d| {
        let mut v = d.to_vec();
        if v.len() >= 4 {
            let body = v.len() - 4;
            let crc = crc32fast::hash(&v[..body]);
            v[body..].copy_from_slice(&crc.to_le_bytes());
        }
        verdict(&m, &v)
    });
}
