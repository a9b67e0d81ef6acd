//! Teacher-forced perplexity: every token is fed, and the log-probability
//! the model gave to the true next token is recorded. Optionally a
//! full-cache run of the same tokens goes alongside (`compare_full`) to
//! measure what the policy changed: KL(full‖policy), top-1 agreement and
//! the attention mass the full cache would have put outside D_t.
//!
//! Paged specs (`page=P`) also report page statistics ([`PagedStats`]):
//! pages and KV bytes in use (peak and final), fragmentation, and the
//! bytes compaction moved per decode step.
//!
//! Quantized KV (`kv_dtype=f16|q8|q4`) can be measured two ways:
//! (b), the default, lets the policy decide on the quantized cache, so
//! quantization error also changes which tokens are evicted (the
//! feedback); (a), [`PerplexityOptions::decisions_from`], runs a reference
//! session with the same spec in another dtype in lockstep and makes the
//! quantized session keep exactly what the reference kept
//! ([`FollowDecisions`]), which measures the quantization error alone.

use crate::session::Session;
use crate::{EngineError, Result, Setting};
use kvslim_cache::policy::{EvictionEvent, FollowDecisions, SharedKeptSets};
use kvslim_cache::{KvDtype, PolicySpec};
use kvslim_kernels::ops::{kl_divergence as kl, log_softmax_at};
use kvslim_models::{Logits, Model, Trace};
use serde::Serialize;

/// How to run the sequence.
#[derive(Clone, Debug)]
pub struct PerplexityOptions {
    /// The first `prefill` tokens go through one prefill chunk; the rest one
    /// decode step at a time (0 or 1 = all decode steps).
    pub prefill: usize,
    /// Count only the predictions after the prefill chunk (NLL, the full
    /// comparison, mode (a)'s): the continuation of a prompt the policy
    /// compressed. The prefill's own predictions come from attention over
    /// the whole chunk, the same for every policy that compresses only
    /// after it. Needs `prefill` ≥ 2 and at least one decode step.
    pub after_prefill: bool,
    pub policy: PolicySpec,
    /// Run the full cache alongside and report divergence.
    pub compare_full: bool,
    /// Record eviction events at steps divisible by this (None = off).
    pub trace_every: Option<u32>,
    /// Mode (a) for quantized KV: eviction decisions come from a reference
    /// session of the same spec with K/V stored in this dtype, run in
    /// lockstep; the policy session keeps exactly the reference's kept
    /// positions. `None` (mode (b)): the policy decides on its own cache.
    pub decisions_from: Option<KvDtype>,
    /// Stop with an error once this instant passes or this flag is set
    /// (checked between fed pieces): a server runs the same code for
    /// `/v1/kv/inspect` under its request timeout and stops when the client
    /// leaves.
    pub stop: Stop,
}

/// When a run gives up early ([`PerplexityOptions::stop`]); the default
/// never stops.
#[derive(Clone, Debug, Default)]
pub struct Stop {
    pub deadline: Option<std::time::Instant>,
    pub cancelled: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Stop {
    /// Why the run must stop now, if it must.
    fn check(&self, fed: usize) -> Result<()> {
        if self.cancelled.as_ref().is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
            return Err(EngineError::Request(format!("cancelled after {fed} tokens")));
        }
        if self.deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return Err(EngineError::Request(format!("deadline passed after {fed} tokens")));
        }
        Ok(())
    }
}

impl PerplexityOptions {
    pub fn new(policy: PolicySpec) -> Self {
        PerplexityOptions {
            prefill: 0,
            after_prefill: false,
            policy,
            compare_full: false,
            trace_every: None,
            decisions_from: None,
            stop: Stop::default(),
        }
    }

    /// Checks that [`decisions_from`](Self::decisions_from) can apply to the
    /// policy: not with head sharing (CHAI decides per request from its own
    /// probe), and not when the policy already stores K/V in that dtype.
    pub fn check_decisions_from(&self) -> Result<()> {
        let Some(d) = self.decisions_from else { return Ok(()) };
        if self.policy.head.is_some() {
            return Err(EngineError::setting(
                Setting::DecisionsFrom,
                "",
                format!(" {d} cannot be used with a head policy (chai, chai-static): `{}`", self.policy),
            ));
        }
        if self.policy.storage.kv_dtype == d {
            return Err(EngineError::setting(
                Setting::DecisionsFrom,
                "",
                format!(
                    " {d}: the policy `{}` already stores K/V as {d}; follow another dtype or give the policy a quantized kv_dtype (e.g. kv_dtype=q8)",
                    self.policy
                ),
            ));
        }
        Ok(())
    }
}

/// Mean and low percentiles of a distribution.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub mean: f64,
    pub p1: f64,
    pub p5: f64,
    pub count: usize,
}

impl Summary {
    pub fn of(values: &mut [f64]) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        values.sort_by(f64::total_cmp);
        let pct = |p: f64| values[((values.len() - 1) as f64 * p).round() as usize];
        Summary {
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p1: pct(0.01),
            p5: pct(0.05),
            count: values.len(),
        }
    }
}

/// Divergence from the full cache on the same tokens.
#[derive(Clone, Debug, Serialize)]
pub struct FullComparison {
    /// Mean KL(full ‖ policy) of the next-token distributions, nats.
    pub kl_mean: f64,
    /// Fraction of positions where both runs rank the same token first.
    pub top1_agreement: f64,
    /// Retained attention mass 1 − m_t over decode steps and query heads.
    pub retained_mass: Summary,
    pub retained_mass_per_layer: Vec<Summary>,
    /// Every (step, layer, query head) retained mass, for pooling across runs.
    #[serde(skip)]
    pub retained_mass_samples: Vec<f64>,
    /// Mean NLL of the full cache on the same tokens.
    pub full_nll: f64,
}

/// Page statistics of a paged policy session (`page=P`), summed over layers
/// and KV heads. `pages` count V pages; each has a K page beside it unless
/// head sharing dropped that head's keys (the byte counts include both).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PagedStats {
    pub page_size: usize,
    /// Most pages referenced at once (after any token or chunk).
    pub pages_peak: usize,
    pub pages_final: usize,
    /// Allocated K/V bytes (codes and scales of referenced pages).
    pub kv_bytes_peak: usize,
    pub kv_bytes_final: usize,
    /// Live tokens after the last token.
    pub live_final: usize,
    /// Allocated − live slots after the last token.
    pub fragmentation_slots: usize,
    /// `fragmentation_slots` as a percentage of the allocated slots.
    pub fragmentation_pct: f64,
    /// Mean over decode steps of the fragmentation percentage.
    pub fragmentation_mean_pct: f64,
    /// Bytes copied by compaction (`compact=N`) over the whole run.
    pub bytes_moved: u64,
    /// `bytes_moved` / decode steps.
    pub bytes_moved_per_step: f64,
    pub shared_pages: usize,
    pub cow_copies: u64,
}

/// Mode (a): what following a reference session's decisions gave.
#[derive(Clone, Debug, Serialize)]
pub struct FollowedDecisions {
    /// K/V dtype of the reference session that made the decisions.
    pub reference_kv_dtype: String,
    /// Mean NLL and perplexity of the reference session.
    pub reference_nll: f64,
    pub reference_ppl: f64,
    /// Mean KL(reference ‖ policy) of the next-token distributions: the
    /// quantization error at identical kept sets.
    pub kl_vs_reference: f64,
    pub top1_vs_reference: f64,
    /// (step or chunk, layer, KV head) kept sets compared with the
    /// reference's, and how many differed (0 unless something is wrong).
    pub kept_sets_checked: usize,
    pub kept_sets_differing: usize,
}

/// Allocated K/V bytes by layer kind (sliding-window models).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LayerKindBytes {
    pub local: usize,
    pub global: usize,
}

impl LayerKindBytes {
    /// Splits a store's allocation by the model's layer kinds (`None` when
    /// every layer is global).
    pub fn of(model: &kvslim_models::Model, store: &kvslim_cache::KvStore) -> Option<Self> {
        let w = model.config.features.sliding_window.as_ref()?;
        let mut out = LayerKindBytes { local: 0, global: 0 };
        for (l, &local) in w.local_layers.iter().enumerate() {
            let b = store.layer_bytes(l).kv;
            if local {
                out.local += b;
            } else {
                out.global += b;
            }
        }
        Some(out)
    }
}

/// Result of a perplexity run (the CLI's `--json` object).
#[derive(Clone, Debug, Serialize)]
pub struct PerplexityReport {
    /// Number of tokens in the sequence.
    pub tokens: usize,
    /// Predictions counted: `tokens - 1`, or those after the prefill chunk
    /// ([`PerplexityOptions::after_prefill`]).
    pub counted: usize,
    /// Mean negative log-likelihood in nats over the counted predictions.
    pub nll: f64,
    pub ppl: f64,
    pub kv_bytes_allocated: usize,
    pub kv_metadata_bytes: usize,
    /// Models with sliding-window layers: allocated K/V bytes of the local
    /// (windowed) and of the global layers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_bytes_by_layer_kind: Option<LayerKindBytes>,
    pub policy: String,
    /// Slot budget per (layer, KV head), when the policy has one.
    pub budget_slots: Option<usize>,
    /// Most K/V bytes allocated at once.
    pub kv_bytes_peak: usize,
    /// Tokens fed one at a time (decode steps).
    pub decode_steps: usize,
    /// Median wall time of one decode step of the policy session, ms.
    pub decode_ms_median: Option<f64>,
    /// Page statistics (paged specs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paged: Option<PagedStats>,
    /// Mode (a) (`decisions_from`): the reference's dtype and divergence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decisions: Option<FollowedDecisions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compare_full: Option<FullComparison>,
    /// CHAI policies: per layer, the clusters (sorted query-head lists,
    /// ordered by first head) and their representatives.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chai_clusters: Option<Vec<kvslim_cache::policy::chai::LayerClustersReport>>,
    /// `logprobs[i] = ln p(ids[i+1] | ids[..=i])`.
    #[serde(skip)]
    pub logprobs: Vec<f64>,
    /// Retained positions per layer and KV head after the last token.
    #[serde(skip)]
    pub kept: Vec<Vec<Vec<u32>>>,
    /// Accumulated scores of those positions (same shape and order).
    #[serde(skip)]
    pub kept_scores: Vec<Vec<Vec<f32>>>,
    /// Eviction events (when tracing).
    #[serde(skip)]
    pub events: Vec<EvictionEvent>,
}

/// The reference session of mode (a) and what is compared against it.
struct Follow<'m> {
    reference: Session<'m>,
    dtype: KvDtype,
    kept: SharedKeptSets,
    kl: f64,
    agree: usize,
    nll: f64,
    rows: usize,
    checked: usize,
    differing: usize,
}

/// Page statistics gathered as the run goes.
#[derive(Default)]
struct PageAcc {
    pages_peak: usize,
    frag_pct_sum: f64,
    frag_steps: usize,
}

fn frag_pct(c: &kvslim_cache::PageCounts) -> f64 {
    let alloc = c.live + c.fragmentation;
    if alloc == 0 {
        0.0
    } else {
        100.0 * c.fragmentation as f64 / alloc as f64
    }
}

/// Runs teacher forcing over `ids`; `progress(done, total)` is called as
/// tokens are processed.
pub fn perplexity(
    model: &Model,
    ids: &[u32],
    opts: &PerplexityOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<PerplexityReport> {
    let n = ids.len();
    if n < 2 {
        return Err(EngineError::Request(format!("perplexity needs at least 2 tokens, got {n}")));
    }
    opts.check_decisions_from()?;
    let bounded = opts.policy.build(n).bounded() && model.config.learned_positions.is_none();
    if n > model.config.context_len && !bounded {
        return Err(EngineError::setting(
            Setting::MaxTokens,
            format!(
                "{n} tokens exceed the model's context of {} (only a bounded policy on a RoPE model may go past it); use ",
                model.config.context_len
            ),
            "",
        ));
    }
    if opts.compare_full && n > model.config.context_len {
        return Err(EngineError::setting(
            Setting::CompareFull,
            "",
            format!(" runs the full cache, which cannot go past the context of {} tokens", model.config.context_len),
        ));
    }
    if opts.prefill > n {
        return Err(EngineError::setting(
            Setting::Prefill,
            "",
            format!(" {} is longer than the {n} tokens", opts.prefill),
        ));
    }
    if opts.after_prefill && (opts.prefill < 2 || opts.prefill >= n - 1) {
        return Err(EngineError::setting(
            Setting::Prefill,
            "",
            format!(
                " {} leaves no prediction to count after it: counting only what follows the prefill needs a prefill of 2 to {} of the {n} tokens",
                opts.prefill,
                n.saturating_sub(2)
            ),
        ));
    }
    // the first prediction counted: the first decode step's
    let counted_from = if opts.after_prefill { opts.prefill } else { 0 };
    let v = model.config.vocab_size;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= v) {
        return Err(kvslim_models::Error::TokenOutOfRange { id, vocab: v }.into());
    }
    let mut follow = match opts.decisions_from {
        None => None,
        Some(d) => {
            let mut spec = opts.policy.clone();
            spec.storage.kv_dtype = d;
            let mut reference = Session::new(model, &spec, n, n)?;
            if let Some(every) = opts.trace_every {
                reference.cache.enable_policy_trace(every);
            }
            Some(Follow {
                reference,
                dtype: d,
                kept: FollowDecisions::handle(),
                kl: 0.0,
                agree: 0,
                nll: 0.0,
                rows: 0,
                checked: 0,
                differing: 0,
            })
        }
    };
    let mut s = match &follow {
        None => Session::new(model, &opts.policy, n, n)?,
        Some(f) => {
            let mut cache = model.new_cache_in(&opts.policy, n, n, None)?;
            cache.follow_decisions(f.kept.clone(), f.reference.cache.policy(), n);
            Session::with_cache(model, cache)
        }
    };
    if let Some(every) = opts.trace_every {
        s.cache.enable_policy_trace(every);
    }
    let mut full = if opts.compare_full { Some(Session::new(model, &PolicySpec::full(), n, n)?) } else { None };
    let mut cmp = CompareAcc::new(model.config.n_layers);
    let mut logprobs = Vec::with_capacity(n - 1);
    // the pieces fed: the prefill (in the reference policy's chunks under
    // mode (a), so the kept sets can be handed over between chunks), then
    // one token at a time; the last token predicts nothing, so it is not fed
    let mut pieces: Vec<(usize, usize)> = Vec::new();
    let mut fed = 0;
    if opts.prefill > 1 {
        let chunk = match &follow {
            Some(f) => f.reference.cache.prefill_chunk().unwrap_or(usize::MAX).max(1),
            None => usize::MAX,
        };
        while fed < opts.prefill {
            let end = fed.saturating_add(chunk).min(opts.prefill);
            pieces.push((fed, end));
            fed = end;
        }
    }
    pieces.extend((fed..n - 1).map(|i| (i, i + 1)));
    let mut step_ms: Vec<f64> = Vec::with_capacity(n);
    let mut kv_peak = 0usize;
    let mut pages = PageAcc::default();
    for &(a, b) in &pieces {
        opts.stop.check(a)?;
        let step = b - a == 1;
        let want = if step { Logits::Last } else { Logits::All };
        let part = &ids[a..b];
        let mut ref_logits = None;
        if let Some(f) = follow.as_mut() {
            ref_logits = Some(f.reference.feed(part, want)?.to_vec());
            *f.kept.lock().unwrap_or_else(|e| e.into_inner()) = f.reference.cache.store().kept_positions();
        }
        let mut full_logits = None;
        if let Some(f) = full.as_mut() {
            if step {
                f.scratch.trace = Some(Trace::default());
                s.scratch.trace = Some(Trace::default());
            }
            full_logits = Some(f.feed(part, want)?);
        }
        let t0 = std::time::Instant::now();
        let logits = s.feed(part, want)?;
        if step {
            step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        let rows = (b - a).min(n - 1 - a);
        for r in 0..rows {
            let target = ids[a + r + 1] as usize;
            let row = &logits[r * v..(r + 1) * v];
            logprobs.push(log_softmax_at(row, target));
            if a + r < counted_from {
                continue;
            }
            if let Some(fl) = &full_logits {
                cmp.logits(&fl[r * v..(r + 1) * v], row, target);
            }
            if let (Some(f), Some(rl)) = (follow.as_mut(), &ref_logits) {
                let rr = &rl[r * v..(r + 1) * v];
                f.kl += kl(rr, row);
                f.agree += usize::from(crate::sampling::argmax(rr) == crate::sampling::argmax(row));
                f.nll -= log_softmax_at(rr, target);
                f.rows += 1;
            }
        }
        if step {
            if let Some(f) = full.as_mut() {
                let (ft, pt) = (f.scratch.trace.take().expect("set above"), s.scratch.trace.take().expect("set above"));
                cmp.mass(model, &ft, &pt);
            }
        }
        if let Some(f) = follow.as_mut() {
            let want = f.kept.lock().unwrap_or_else(|e| e.into_inner());
            let got = s.cache.store().kept_positions();
            for (wl, gl) in want.iter().zip(&got) {
                for (wh, gh) in wl.iter().zip(gl) {
                    f.checked += 1;
                    f.differing += usize::from(wh != gh);
                }
            }
        }
        kv_peak = kv_peak.max(s.cache.store().bytes().kv);
        if let Some(c) = s.cache.store().page_counts() {
            pages.pages_peak = pages.pages_peak.max(c.pages);
            if step {
                pages.frag_pct_sum += frag_pct(&c);
                pages.frag_steps += 1;
            }
        }
        if !step || a % 16 == 0 {
            progress(b, n);
        }
    }
    progress(n, n);
    let counted = &logprobs[counted_from..];
    let nll = -counted.iter().sum::<f64>() / counted.len() as f64;
    let bytes = s.kv_bytes();
    let decode_steps = step_ms.len();
    let decode_ms_median = (!step_ms.is_empty()).then(|| {
        step_ms.sort_by(f64::total_cmp);
        step_ms[step_ms.len() / 2]
    });
    let paged = s.cache.store().page_counts().map(|c| PagedStats {
        page_size: opts.policy.storage.page_size.unwrap_or(0),
        pages_peak: pages.pages_peak.max(c.pages),
        pages_final: c.pages,
        kv_bytes_peak: kv_peak.max(bytes.kv),
        kv_bytes_final: bytes.kv,
        live_final: c.live,
        fragmentation_slots: c.fragmentation,
        fragmentation_pct: frag_pct(&c),
        fragmentation_mean_pct: if pages.frag_steps > 0 {
            pages.frag_pct_sum / pages.frag_steps as f64
        } else {
            frag_pct(&c)
        },
        bytes_moved: c.bytes_moved,
        bytes_moved_per_step: c.bytes_moved as f64 / decode_steps.max(1) as f64,
        shared_pages: c.shared_pages,
        cow_copies: c.cow_copies,
    });
    let events = match follow.as_mut() {
        Some(f) => f.reference.cache.take_policy_events(),
        None => s.cache.take_policy_events(),
    };
    let decisions = follow.map(|f| {
        let rows = f.rows.max(1) as f64;
        FollowedDecisions {
            reference_kv_dtype: f.dtype.to_string(),
            reference_nll: f.nll / rows,
            reference_ppl: (f.nll / rows).exp(),
            kl_vs_reference: f.kl / rows,
            top1_vs_reference: f.agree as f64 / rows,
            kept_sets_checked: f.checked,
            kept_sets_differing: f.differing,
        }
    });
    Ok(PerplexityReport {
        tokens: n,
        counted: counted.len(),
        nll,
        ppl: nll.exp(),
        kv_bytes_allocated: bytes.kv,
        kv_metadata_bytes: bytes.metadata,
        kv_bytes_by_layer_kind: LayerKindBytes::of(model, s.cache.store()),
        policy: opts.policy.to_string(),
        budget_slots: opts.policy.budget(n),
        kv_bytes_peak: kv_peak.max(bytes.kv),
        decode_steps,
        decode_ms_median,
        paged,
        decisions,
        compare_full: full.is_some().then(|| cmp.finish()),
        chai_clusters: s.cache.head_sharing().map(|h| h.report()),
        logprobs,
        kept: s.cache.store().kept_positions(),
        kept_scores: s.cache.store().kept_scores(),
        events,
    })
}

/// Accumulates the full-cache comparison.
struct CompareAcc {
    kl: Vec<f64>,
    agree: usize,
    full_nll: Vec<f64>,
    mass: Vec<Vec<f64>>,
}

impl CompareAcc {
    fn new(layers: usize) -> Self {
        CompareAcc { kl: Vec::new(), agree: 0, full_nll: Vec::new(), mass: vec![Vec::new(); layers] }
    }

    fn logits(&mut self, full: &[f32], policy: &[f32], target: usize) {
        self.kl.push(kl(full, policy));
        if crate::sampling::argmax(full) == crate::sampling::argmax(policy) {
            self.agree += 1;
        }
        self.full_nll.push(-log_softmax_at(full, target));
    }

    /// Retained mass Σ_{i∈D_t} a^full_{t,i} per layer and query head.
    fn mass(&mut self, model: &Model, full: &Trace, policy: &Trace) {
        let c = &model.config;
        let g = c.group_size();
        for (l, acc) in self.mass.iter_mut().enumerate() {
            let attn = &full.attn[l];
            let ctx = full.ctx;
            for h in 0..c.n_heads {
                let row = &attn[h * ctx..(h + 1) * ctx];
                let kept = &policy.candidates[l][h / g];
                acc.push(kept.iter().map(|&p| row[p as usize] as f64).sum::<f64>().min(1.0));
            }
        }
    }

    fn finish(mut self) -> FullComparison {
        let n = self.kl.len().max(1) as f64;
        let mut all: Vec<f64> = self.mass.iter().flatten().copied().collect();
        FullComparison {
            kl_mean: self.kl.iter().sum::<f64>() / n,
            top1_agreement: self.agree as f64 / n,
            retained_mass: Summary::of(&mut all),
            retained_mass_samples: all,
            retained_mass_per_layer: self.mass.iter_mut().map(|m| Summary::of(m)).collect(),
            full_nll: self.full_nll.iter().sum::<f64>() / self.full_nll.len().max(1) as f64,
        }
    }
}
