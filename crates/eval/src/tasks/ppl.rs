//! `ppl:FILE[,seq_len=N][,prompt=P]`: perplexity of a text cut into BOS-led
//! windows ([`PplText::windows`]), every token a decode step (or one
//! prefill in [`ScoreMode::Prefill`]). `prompt=P`: each window's first P
//! tokens are one prefill chunk, a prompt the policy compresses (SnapKV's,
//! KVzap's, KVzip's prefill), and the metrics count only the predictions
//! after it, its teacher-forced continuation.
//!
//! Metrics: token-weighted `nll` and `ppl`; with `compare_full`, `kl` =
//! mean KL(full‖policy), `top1` = top-1 agreement and `retained_mass` =
//! mean attention mass the full cache puts on the kept tokens,
//! `retained_mass_p1` / `_p5` its 1st and 5th percentiles over steps,
//! layers and query heads (the `full` policy gets kl 0, top1 1, mass 1).
//! Budgets resolve against each window. Every cell also reports
//! `kv_bytes_peak` (most K/V bytes of one window's cache at once); paged
//! specs (`page=P`) add `pages_peak` (most pages of one window at once),
//! `fragmentation` (allocated − live slots as % of allocated, mean over
//! decode steps, token-weighted) and `bytes_moved_per_step` (bytes
//! compaction copied / decode steps). With
//! [`crate::MatrixConfig::decisions_from`] (mode (a) for quantized KV),
//! cells whose spec stores K/V in another dtype follow the eviction
//! decisions of a reference run in that dtype and add `ref_ppl` (the
//! reference's perplexity), `kl_ref` (KL(reference‖policy)) and
//! `kept_differing` (kept sets that differed from the reference's, 0 by
//! construction); the row records `decisions_from`.

use super::kind::{file_spec, number, set_option, unless_default, Kind, KvPeak, Prepared, Task};
use super::text::{load_ppl_text, PplText};
use crate::budget::{BudgetedPolicy, PolicySource};
use crate::cell::{par_blocks, Cell};
use crate::error::{EvalError, Result};
use crate::score::ScoreMode;
use kvslim_cache::{KvDtype, PolicySpec};
use kvslim_engine::{perplexity, PerplexityOptions};
use kvslim_models::{Model, Tokenizer};
use std::path::{Path, PathBuf};

pub const DEFAULT_SEQ_LEN: usize = 512;

pub const KIND: Kind = Kind {
    names: &["ppl"],
    file: true,
    extensions: &[".raw", ".txt", ".tokens"],
    options: "seq_len, prompt, limit",
    headline: &["ppl", "nll", "kl", "top1"],
    new: |_, path| Box::new(Ppl { path, seq_len: DEFAULT_SEQ_LEN, prompt: 0 }),
};

/// Text → BOS + `seq_len` − 1 token windows; `limit` counts windows.
#[derive(Clone, Debug, PartialEq)]
pub struct Ppl {
    pub path: PathBuf,
    pub seq_len: usize,
    /// Tokens of each window prefilled as a prompt, whose continuation alone
    /// is scored (0: none).
    pub prompt: usize,
}

impl Task for Ppl {
    fn name(&self) -> &'static str {
        "ppl"
    }

    fn set(&mut self, key: &str, vals: &[&str]) -> Result<bool, String> {
        if set_option(&mut self.prompt, key, "prompt", vals, |k, v| match number(k, v)? {
            n if n < 2 => Err("prompt must be ≥ 2 tokens (a prefill chunk)".into()),
            n => Ok(n),
        })? {
            return Ok(true);
        }
        set_option(&mut self.seq_len, key, "seq_len", vals, |k, v| match number(k, v)? {
            n if n < 2 => Err("seq_len must be ≥ 2".into()),
            n => Ok(n),
        })
    }

    fn default_seq_len(&mut self, seq_len: usize) -> Result<(), String> {
        if seq_len < 2 {
            return Err("seq_len must be at least 2".into());
        }
        self.seq_len = seq_len;
        Ok(())
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn render(&self, short: bool) -> String {
        file_spec(
            "ppl",
            &self.path,
            short,
            &[unless_default("seq_len", self.seq_len, DEFAULT_SEQ_LEN), unless_default("prompt", self.prompt, 0)],
        )
    }

    /// `from` when the policy evicts (not `full`), has no head sharing,
    /// and stores K/V in another dtype; `None` otherwise (the cell runs as
    /// usual).
    fn decisions_from(&self, policy: &BudgetedPolicy, from: Option<KvDtype>) -> Result<Option<KvDtype>> {
        let Some(d) = from else { return Ok(None) };
        let spec = policy.sample_spec()?;
        let evicts = spec.token != kvslim_cache::policy::TokenPolicySpec::Full;
        Ok((evicts && spec.head.is_none() && spec.storage.kv_dtype != d).then_some(d))
    }

    fn prepare(&self, model: &Model, tok: &Tokenizer, limit: Option<usize>) -> Result<Box<dyn Prepared>> {
        let text: PplText = load_ppl_text(&self.path)?;
        let seq_len = self.seq_len.min(model.config.context_len);
        if self.prompt > 0 && self.prompt + 2 > seq_len {
            return Err(EvalError::File {
                path: text.path.clone(),
                reason: format!(
                    "prompt={} leaves no continuation to score in windows of {seq_len} tokens; give it at most {}",
                    self.prompt,
                    seq_len.saturating_sub(2)
                ),
            });
        }
        let windows = text.windows(tok, seq_len, limit)?;
        if windows.is_empty() {
            return Err(EvalError::File { path: text.path.clone(), reason: "too short for one window".into() });
        }
        Ok(Box::new(Windows { task: self.clone(), windows }))
    }
}

struct Windows {
    task: Ppl,
    windows: Vec<Vec<u32>>,
}

impl Prepared for Windows {
    fn items(&self) -> usize {
        self.windows.len()
    }

    fn run(&mut self, cell: &mut Cell<'_>) -> Result<KvPeak> {
        let (model, policy, options, windows) = (cell.model, cell.policy, cell.options, &self.windows);
        let mut peak = KvPeak::default();
        // the plain full cache (no storage keys, no CHAI) is its own reference
        let is_full = policy.sample_spec()? == PolicySpec::full();
        let prompt = self.task.prompt;
        let prefill = |n: usize| match (prompt, options.mode) {
            (p, _) if p > 0 => p.min(n),
            (_, ScoreMode::Prefill) => n,
            _ => 0,
        };
        let follows = self.task.decisions_from(policy, options.decisions_from)?;
        let row = &mut *cell.row;
        row.key.decisions_from = follows.map(|d| d.to_string());
        let reps = par_blocks(
            windows.len(),
            |i| {
                let w = &windows[i];
                let mut o = PerplexityOptions::new(policy.spec_for(w.len())?);
                o.prefill = prefill(w.len());
                o.after_prefill = prompt > 0;
                o.compare_full = options.compare_full && !is_full;
                o.decisions_from = follows;
                Ok(perplexity(model, w, &o, |_, _| {})?)
            },
            |d| (cell.report)(d, windows.len()),
        )?;
        let m = &mut row.metrics;
        let mut paged = false;
        let (mut pages_peak, mut kv_peak, mut frag, mut moved, mut steps) = (0usize, 0usize, 0.0, 0u64, 0usize);
        let (mut ref_nll, mut kl_ref, mut differing) = (0.0, 0.0, 0usize);
        let mut step_ms = Vec::new();
        for r in &reps {
            kv_peak = kv_peak.max(r.kv_bytes_peak);
            step_ms.extend(r.decode_ms_median);
            if let Some(p) = &r.paged {
                paged = true;
                pages_peak = pages_peak.max(p.pages_peak);
                frag += p.fragmentation_mean_pct * r.decode_steps as f64;
                moved += p.bytes_moved;
                steps += r.decode_steps;
            }
            if let Some(d) = &r.decisions {
                let n = r.counted as f64;
                ref_nll += d.reference_nll * n;
                kl_ref += d.kl_vs_reference * n;
                differing += d.kept_sets_differing;
            }
        }
        m.insert("kv_bytes_peak".into(), kv_peak as f64);
        if paged {
            m.insert("pages_peak".into(), pages_peak as f64);
            m.insert("fragmentation".into(), frag / steps.max(1) as f64);
            m.insert("bytes_moved_per_step".into(), moved as f64 / steps.max(1) as f64);
        }
        if !step_ms.is_empty() {
            // median over windows of each window's median decode step
            step_ms.sort_by(f64::total_cmp);
            row.timings.insert("step_ms".into(), step_ms[step_ms.len() / 2]);
        }
        if follows.is_some() {
            let toks: usize = reps.iter().map(|r| r.counted).sum();
            let t = toks.max(1) as f64;
            m.insert("ref_ppl".into(), (ref_nll / t).exp());
            m.insert("kl_ref".into(), kl_ref / t);
            m.insert("kept_differing".into(), differing as f64);
        }
        let (mut nll, mut toks, mut kl, mut top1, mut mass, mut cmp_toks) = (0.0, 0usize, 0.0, 0.0, 0.0, 0usize);
        let mut mass_samples: Vec<f64> = Vec::new();
        for r in &reps {
            let n = r.counted;
            nll += r.nll * n as f64;
            toks += n;
            peak.see(r.kv_bytes_allocated, r.kv_metadata_bytes);
            if let Some(c) = &r.compare_full {
                kl += c.kl_mean * n as f64;
                top1 += c.top1_agreement * n as f64;
                mass += c.retained_mass.mean * n as f64;
                mass_samples.extend_from_slice(&c.retained_mass_samples);
                cmp_toks += n;
            }
        }
        let nll = nll / toks.max(1) as f64;
        m.insert("nll".into(), nll);
        row.per_item.insert("nll".into(), reps.iter().map(|r| r.nll).collect());
        m.insert("ppl".into(), nll.exp());
        m.insert("tokens".into(), toks as f64);
        if is_full && options.compare_full {
            m.insert("kl".into(), 0.0);
            m.insert("top1".into(), 1.0);
            m.insert("retained_mass".into(), 1.0);
            m.insert("retained_mass_p1".into(), 1.0);
            m.insert("retained_mass_p5".into(), 1.0);
        } else if cmp_toks > 0 {
            let c = cmp_toks as f64;
            m.insert("kl".into(), kl / c);
            m.insert("top1".into(), top1 / c);
            m.insert("retained_mass".into(), mass / c);
            let pooled = kvslim_engine::Summary::of(&mut mass_samples);
            m.insert("retained_mass_p1".into(), pooled.p1);
            m.insert("retained_mass_p5".into(), pooled.p5);
        }
        Ok(peak)
    }
}
