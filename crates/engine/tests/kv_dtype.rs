//! Quantized KV storage on stories260K (issue #7): what f16 / q8 / q4 K and V
//! cost in perplexity, and the bytes they save, under `full` and `h2o`, in
//! the fixed-slot and the paged layouts.

use kvslim_cache::{KvDtype, PageCounts, PolicySpec};
use kvslim_engine::beam::log_softmax;
use kvslim_engine::Session;
use kvslim_models::{Logits, Model};
mod common;

use common::{stories, tokens};

struct Run {
    ppl: f64,
    kv_bytes: usize,
    pages: Option<PageCounts>,
}

/// Teacher-forced perplexity: the first `prompt_len` tokens prefilled in one
/// call (their logits all scored), then one token per decode step.
fn run(m: &Model, spec: &PolicySpec, ids: &[u32], prompt_len: usize) -> Run {
    let v = m.config.vocab_size;
    let mut s = Session::new(m, spec, ids.len(), ids.len()).unwrap();
    let mut nll = 0.0;
    let all = s.feed(&ids[..prompt_len], Logits::All).unwrap().to_vec();
    for i in 0..prompt_len {
        nll -= log_softmax(&all[i * v..(i + 1) * v])[ids[i + 1] as usize];
    }
    for i in prompt_len..ids.len() - 1 {
        nll -= log_softmax(s.feed(&[ids[i]], Logits::Last).unwrap())[ids[i + 1] as usize];
    }
    Run {
        ppl: (nll / (ids.len() - 1) as f64).exp(),
        kv_bytes: s.cache.store().bytes().kv,
        pages: s.cache.store().page_counts(),
    }
}

/// Bytes of one K or V row of `d` elements, from the codec definitions:
/// f32 4d; f16 2d; q8 one byte per element plus an f32 scale per group of
/// 32; q4 a nibble per element plus an f32 scale and min per group; codes
/// padded to 4 bytes.
fn row_bytes(dtype: KvDtype, d: usize) -> usize {
    let pad4 = |b: usize| b.div_ceil(4) * 4;
    let groups = d.div_ceil(32);
    match dtype {
        KvDtype::F32 => 4 * d,
        KvDtype::F16 => pad4(2 * d),
        KvDtype::Q8 => pad4(d) + 4 * groups,
        KvDtype::Q4 => pad4(d.div_ceil(2)) + 8 * groups,
    }
}

/// Relative perplexity change allowed against f32 storage. f16 (0.1 %) and
/// q8 (1 %) are the bounds; measured here: f16 +0.002…+0.02 %, q8
/// −0.15…+0.43 %.
///
/// q4 is measured, not assumed: +28.7 % (h2o 16+16), +31.1 % (h2o 8+24
/// max), +34.9 % (full), identical in both layouts. That is far above the
/// 10 % one would expect of a larger model, and it is the model, not the
/// codec: stories260K's heads are 8 wide, so each q4 group (f32 scale + min,
/// 16 levels) spans one 8-element row. The codec itself is exact to its
/// definition (max error = range/30 per element, 5 % relative RMS on
/// Gaussian rows, checked by hand while writing this test), and at 8-wide
/// heads that error lands directly on tiny, sharp attention logits. 45 %
/// leaves ~10 points of headroom over the worst measured case; a broken q4
/// path (scales not moving with codes, wrong nibble order) lands in the
/// hundreds of percent (uniform prediction would be ×130).
fn tolerance(dtype: KvDtype) -> f64 {
    match dtype {
        KvDtype::F32 => 0.0,
        KvDtype::F16 => 0.001,
        KvDtype::Q8 => 0.01,
        KvDtype::Q4 => 0.45,
    }
}

#[test]
fn quantized_kv_perplexity_stays_close_to_f32_and_bytes_follow_the_codec() {
    let m = stories();
    let d = m.model.config.head_dim;
    let ids = tokens(&m, 300);
    let prompt_len = 64;
    for base in ["full", "h2o:heavy=16,recent=16", "h2o:heavy=8,recent=24,agg=max"] {
        let mut fixed_ppl = Vec::new();
        for page in [None, Some(16)] {
            let spec = |dtype: KvDtype| {
                let mut s = PolicySpec::parse(base).unwrap();
                s.storage.page_size = page;
                s.storage.kv_dtype = dtype;
                s
            };
            let reference = run(&m.model, &spec(KvDtype::F32), &ids, prompt_len);
            for dtype in KvDtype::ALL {
                let r = run(&m.model, &spec(dtype), &ids, prompt_len);
                let what = format!("{}", spec(dtype));
                let rel = r.ppl / reference.ppl - 1.0;
                // the layout never changes a result, quantized or not
                match page {
                    None => fixed_ppl.push(r.ppl),
                    Some(_) => {
                        assert_eq!(
                            r.ppl.to_bits(),
                            fixed_ppl[KvDtype::ALL.iter().position(|&k| k == dtype).unwrap()].to_bits(),
                            "{what}: paged vs fixed"
                        )
                    }
                }
                eprintln!(
                    "{what}: ppl {:.5} vs f32 {:.5} ({:+.4} %), KV {} bytes",
                    r.ppl,
                    reference.ppl,
                    100.0 * rel,
                    r.kv_bytes
                );
                assert!(
                    rel.abs() <= tolerance(dtype),
                    "{what}: perplexity {} vs f32 {} ({:+.4} %)",
                    r.ppl,
                    reference.ppl,
                    100.0 * rel
                );
                if dtype != KvDtype::F32 {
                    assert_ne!(r.ppl, reference.ppl, "{what}: quantization must change something");
                }
                // K and V rows of every allocated slot (fixed) or page (paged), at the codec's row size
                let rows = match (page, r.pages) {
                    (None, None) => reference.kv_bytes / row_bytes(KvDtype::F32, d),
                    (Some(p), Some(c)) => 2 * c.pages * p,
                    _ => panic!("{what}: layout and page counts disagree"),
                };
                assert_eq!(r.kv_bytes, rows * row_bytes(dtype, d), "{what}: bytes");
                // same slots or pages as f32 → the byte ratio is exactly the codec's
                if r.pages.map(|c| c.pages) == reference.pages.map(|c| c.pages) {
                    assert_eq!(
                        r.kv_bytes * row_bytes(KvDtype::F32, d),
                        reference.kv_bytes * row_bytes(dtype, d),
                        "{what}: ratio"
                    );
                }
            }
        }
    }
    // the ratios themselves, for stories260K's head_dim of 8 and a typical 64
    assert_eq!((row_bytes(KvDtype::F16, 8), row_bytes(KvDtype::Q8, 8), row_bytes(KvDtype::Q4, 8)), (16, 12, 12));
    assert_eq!((row_bytes(KvDtype::F16, 64), row_bytes(KvDtype::Q8, 64), row_bytes(KvDtype::Q4, 64)), (128, 72, 48));
}
