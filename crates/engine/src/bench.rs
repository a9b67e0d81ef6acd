//! Throughput benchmark: prefill and decode tokens per second (medians of
//! repeats), measured beside the machine's read bandwidth so decode speed
//! can be stated as a fraction of the memory-bandwidth bound.

use crate::sampling::Rng;
use crate::session::Session;
use crate::Result;
use kvslim_cache::PolicySpec;
use kvslim_models::{Logits, Model};
use rayon::prelude::*;
use serde::Serialize;
use std::time::Instant;

/// Benchmark parameters.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub prompt_len: usize,
    pub gen_len: usize,
    pub repeats: usize,
    pub policy: PolicySpec,
}

/// One benchmark row (one model × thread count).
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub model: String,
    pub threads: usize,
    pub isa: String,
    pub weight_bytes: usize,
    pub params: usize,
    pub prompt_len: usize,
    pub gen_len: usize,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub decode_ms_per_token: f64,
    pub kv_bytes_allocated: usize,
    /// Measured read bandwidth with the same thread count (GB/s, 1e9 bytes).
    pub bandwidth_gb_s: f64,
    /// K/V bytes one decode step reads at mid-generation: the slots the
    /// policy holds then, in its KV dtype.
    pub kv_read_bytes: usize,
    /// Bytes streamed per decode token (weights + `kv_read_bytes`).
    pub bytes_per_token: usize,
    /// bandwidth / bytes_per_token.
    pub bound_tok_s: f64,
    /// decode_tok_s / bound_tok_s.
    pub fraction_of_bound: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `bytes` (a multiple of 4, from a 64-byte aligned buffer) as f32s.
fn bytemuck_f32_mut(bytes: &mut [u8]) -> &mut [f32] {
    assert!(bytes.len().is_multiple_of(4) && (bytes.as_ptr() as usize).is_multiple_of(4));
    // SAFETY: aligned, sized, and every bit pattern is an f32.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut f32, bytes.len() / 4) }
}

/// Best-of-3 read bandwidth over a buffer much larger than the caches, using
/// the current rayon pool's threads.
pub fn measure_read_bandwidth(bytes: usize) -> f64 {
    let n = bytes / 4;
    // laid out as the weights are (huge pages where the system grants them)
    let mut lines = kvslim_kernels::matrix::Lines::zeroed(bytes);
    let buf: &mut [f32] = bytemuck_f32_mut(&mut lines.bytes_mut()[..n * 4]);
    buf.par_iter_mut().enumerate().for_each(|(i, v)| *v = (i & 1023) as f32);
    let buf: &[f32] = buf;
    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let chunk = n / (rayon::current_num_threads() * 8);
        let s: f32 = buf.par_chunks(chunk.max(1024)).map(kvslim_kernels::ops::streaming_sum).sum();
        let dt = t.elapsed().as_secs_f64();
        std::hint::black_box(s);
        best = best.max(bytes as f64 / dt / 1e9);
    }
    best
}

/// Runs the benchmark in the current rayon pool.
pub fn run(model: &Model, name: &str, opts: &BenchOptions, bandwidth_gb_s: f64) -> Result<BenchReport> {
    let c = &model.config;
    let mut rng = Rng::new(7);
    let prompt: Vec<u32> = (0..opts.prompt_len).map(|_| (rng.next_u64() % c.vocab_size as u64) as u32).collect();
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    let mut kv = 0;
    // K and V one decode step reads at the middle of generation, as the
    // policy and KV dtype hold them
    let mut kv_read = 0;
    for _ in 0..opts.repeats.max(1) {
        let mut s = Session::new(model, &opts.policy, opts.prompt_len + opts.gen_len + 1, opts.prompt_len)?;
        let t = Instant::now();
        s.feed(&prompt, Logits::Last)?;
        prefill.push(opts.prompt_len as f64 / t.elapsed().as_secs_f64());
        let mut tok = crate::sampling::argmax(s.scratch.logits());
        let t = Instant::now();
        for step in 0..opts.gen_len {
            if step == opts.gen_len / 2 {
                kv_read = s.cache.store().attended_kv_bytes();
            }
            tok = crate::sampling::argmax(s.feed(&[tok], Logits::Last)?);
        }
        decode.push(opts.gen_len as f64 / t.elapsed().as_secs_f64());
        kv = s.kv_bytes().kv;
    }
    let (params, weight_bytes) = model.weights.size();
    let bytes_per_token = weight_bytes + kv_read;
    let decode_tok_s = median(decode);
    let bound = bandwidth_gb_s * 1e9 / bytes_per_token as f64;
    Ok(BenchReport {
        model: name.to_string(),
        threads: rayon::current_num_threads(),
        isa: kvslim_kernels::dot::kernels().isa.to_string(),
        weight_bytes,
        params,
        prompt_len: opts.prompt_len,
        gen_len: opts.gen_len,
        prefill_tok_s: median(prefill),
        decode_tok_s,
        decode_ms_per_token: 1000.0 / decode_tok_s,
        kv_bytes_allocated: kv,
        bandwidth_gb_s,
        kv_read_bytes: kv_read,
        bytes_per_token,
        bound_tok_s: bound,
        fraction_of_bound: decode_tok_s / bound,
    })
}

/// One point of the decode-step-time sweep.
#[derive(Clone, Debug, Serialize)]
pub struct StepTimePoint {
    pub model: String,
    pub policy: String,
    pub threads: usize,
    /// Original position of the decoded token (tokens seen so far).
    pub context: usize,
    /// Slots actually attended per (layer, KV head).
    pub slots: usize,
    pub step_ms_median: f64,
    /// K/V and metadata bytes after the steps (paged stores hold pages for
    /// what they hold, so this is measured, not known up front).
    pub kv_bytes_allocated: usize,
    pub kv_metadata_bytes: usize,
}

/// Decode step time at a given context length: the cache is filled with
/// random keys and values for `context − steps` tokens (or the policy's
/// budget), then `steps` decode steps are timed, the last at position
/// `context − 1`. Step time depends on the number of
/// slots, not on their content, so this avoids an O(n²) prefill per point.
pub fn step_time(
    model: &Model,
    name: &str,
    policy: &PolicySpec,
    context: usize,
    steps: usize,
) -> Result<StepTimePoint> {
    let steps = steps.min(context.saturating_sub(1)).max(1);
    let context = context - steps;
    let mut s = Session::new(model, policy, context + steps, context + steps)?;
    let mut rng = Rng::new(context as u64);
    s.cache.fill_for_timing(context, |k, v| {
        k.iter_mut().chain(v.iter_mut()).for_each(|x| *x = rng.next_f32() - 0.5);
    });
    let mut times = Vec::with_capacity(steps);
    let mut tok = 1u32;
    for _ in 0..steps {
        let t = Instant::now();
        tok = crate::sampling::argmax(s.feed(&[tok], Logits::Last)?);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(StepTimePoint {
        model: name.to_string(),
        policy: policy.to_string(),
        threads: rayon::current_num_threads(),
        context: context + steps,
        slots: s.cache.store().head(0, 0).len(),
        step_ms_median: median(times),
        kv_bytes_allocated: s.kv_bytes().kv,
        kv_metadata_bytes: s.kv_bytes().metadata,
    })
}

/// One point of the verification-cost sweep: a pass over `chunk` tokens
/// (speculative decoding verifying `chunk − 1` drafts, every matrix
/// product one GEMM over the chunk) against one decode step at the same
/// context. Speculative decoding pays as much as `ratio` stays near 1.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyPoint {
    pub model: String,
    pub policy: String,
    pub threads: usize,
    pub context: usize,
    pub chunk: usize,
    pub pass_ms_median: f64,
    pub step_ms_median: f64,
    /// pass / step.
    pub ratio: f64,
}

/// Times [`Model::forward_verify`] over chunks of `chunks` tokens and one
/// decode step, each `repeats` times from the same cache (filled with
/// random K/V for `context` tokens, as [`step_time`] does) and reports the
/// medians.
pub fn verify_time(
    model: &Model,
    name: &str,
    policy: &PolicySpec,
    context: usize,
    chunks: &[usize],
    repeats: usize,
) -> Result<Vec<VerifyPoint>> {
    let longest = chunks.iter().copied().max().unwrap_or(1);
    let mut s = Session::new(model, policy, context + longest + 1, context + longest + 1)?;
    let mut rng = Rng::new(context as u64);
    s.cache.fill_for_timing(context, |k, v| {
        k.iter_mut().chain(v.iter_mut()).for_each(|x| *x = rng.next_f32() - 0.5);
    });
    let vocab = model.config.vocab_size as u64;
    let tokens: Vec<u32> = (0..longest).map(|_| (rng.next_u64() % vocab) as u32).collect();
    let filled = s.cache.clone();
    let mut time = |n: usize| -> Result<f64> {
        let mut times = Vec::with_capacity(repeats);
        for _ in 0..repeats.max(1) {
            // cut back where nothing was evicted (no copy that would evict
            // the CPU caches before the timed pass), else start from a copy
            if s.cache.truncate(context).is_err() {
                s.cache.clone_from(&filled);
            }
            let t = Instant::now();
            if n == 1 {
                model.forward(&tokens[..1], &mut s.cache, &mut s.scratch, Logits::Last)?;
            } else {
                model.forward_verify(&tokens[..n], &mut s.cache, &mut s.scratch)?;
            }
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(median(times))
    };
    let step = time(1)?;
    let mut out = Vec::with_capacity(chunks.len());
    for &chunk in chunks {
        let pass = if chunk == 1 { step } else { time(chunk)? };
        out.push(VerifyPoint {
            model: name.to_string(),
            policy: policy.to_string(),
            threads: rayon::current_num_threads(),
            context,
            chunk,
            pass_ms_median: pass,
            step_ms_median: step,
            ratio: pass / step,
        });
    }
    Ok(out)
}

/// One policy's memory footprint over a real generation, and how many such
/// sequences fit a KV memory budget.
#[derive(Clone, Debug, Serialize)]
pub struct CapacityRow {
    pub model: String,
    pub policy: String,
    pub prompt_len: usize,
    pub gen_len: usize,
    /// Largest allocated K/V bytes seen after any step (pages referenced,
    /// or the fixed arrays).
    pub peak_kv_bytes: usize,
    /// Metadata bytes (positions, scores, page tables) at that peak.
    pub peak_metadata_bytes: usize,
    /// Pages referenced at the peak (paged stores; K and V pages counted once per head).
    pub peak_pages: Option<usize>,
    /// Bytes copied by compaction per decode step.
    pub bytes_moved_per_step: f64,
    pub decode_tok_s: f64,
    /// What a server reserves for such a sequence before running it
    /// ([`kvslim_cache::accounting::reservation`]; ≥ the peak).
    pub reserved_bytes: usize,
    /// The KV memory budget and the sequences whose peak fits in it.
    pub kv_memory: u64,
    pub max_batch: u64,
}

/// Prefills `prompt`, decodes `gen_len` greedy tokens, and records the
/// peak allocated bytes after every step: the per-sequence cost that
/// bounds the batch a server can hold in `kv_memory` bytes.
pub fn capacity(
    model: &Model,
    name: &str,
    policy: &PolicySpec,
    prompt: &[u32],
    gen_len: usize,
    kv_memory: u64,
) -> Result<CapacityRow> {
    let max_len = prompt.len() + gen_len + 1;
    let reserved = kvslim_cache::accounting::reservation(policy, &model.cache_shape(), max_len, prompt.len())
        .map_err(kvslim_models::Error::from)?
        .total();
    let mut s = Session::new(model, policy, max_len, prompt.len())?;
    let mut tok = crate::sampling::argmax(s.feed(prompt, Logits::Last)?);
    let mut peak = s.kv_bytes();
    let mut peak_pages = s.cache.store().page_counts().map(|c| c.pages);
    let moved_before = s.cache.store().page_counts().map_or(0, |c| c.bytes_moved);
    let t = Instant::now();
    for _ in 0..gen_len {
        tok = crate::sampling::argmax(s.feed(&[tok], Logits::Last)?);
        let b = s.kv_bytes();
        if b.kv + b.metadata > peak.kv + peak.metadata {
            peak = b;
        }
        if let Some(c) = s.cache.store().page_counts() {
            peak_pages = Some(peak_pages.unwrap_or(0).max(c.pages));
        }
    }
    let decode_tok_s = gen_len as f64 / t.elapsed().as_secs_f64();
    let moved = s.cache.store().page_counts().map_or(0, |c| c.bytes_moved) - moved_before;
    Ok(CapacityRow {
        model: name.to_string(),
        policy: policy.to_string(),
        prompt_len: prompt.len(),
        gen_len,
        peak_kv_bytes: peak.kv,
        peak_metadata_bytes: peak.metadata,
        peak_pages,
        bytes_moved_per_step: moved as f64 / gen_len.max(1) as f64,
        decode_tok_s,
        reserved_bytes: reserved,
        kv_memory,
        max_batch: kv_memory / (peak.kv + peak.metadata).max(1) as u64,
    })
}
