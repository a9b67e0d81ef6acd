//! `kvslim tune`: choose a KV policy for a model by measurement on
//! calibration text, at a fixed total budget or for a quality target.
//!
//! **Objective.** Candidates are ranked by the mean KL(full‖policy) per
//! predicted token over the calibration windows (teacher forced, every
//! token a decode step, [`kvslim_engine::perplexity`] with the full cache
//! alongside), ties broken by NLL, then by grid order. KL rather than NLL
//! because it measures what a policy changes against the model it
//! approximates, on every token, whatever the text's own difficulty; NLL,
//! perplexity and top-1 agreement are reported beside it.
//!
//! **Space.** Every candidate holds the same B slots per (layer, KV head)
//! (B = the budget resolved against the window length, as
//! [`Budget::resolve`]): the baselines (`window`, `sink`, `heavy`,
//! `random`, the paper's H2O half/half) and H2O with each score family,
//! with and without 4 sinks, at three heavy/recent splits
//! ([`candidate_grid`]).
//!
//! **Search.** Successive halving ([`successive_halving`]): every candidate
//! is scored on the first window, the best 1/η go on to η times as many
//! windows, and so on until the survivors have seen all of them (a
//! candidate's windows are never scored twice). Cheap candidates that are
//! clearly bad on one window leave early; the finalists are compared on the
//! whole calibration set.
//!
//! **Held-out text.** Tuning never reads evaluation windows: the tune
//! windows are cut from the calibration text starting at a token offset
//! (default: the second half of its tokens, [`calibration_windows`]), and an
//! evaluation on the same file is refused unless its windows (the first K,
//! as `ppl:FILE,seq_len=L,limit=K` takes them) lie entirely before that
//! offset ([`check_disjoint`]).

use crate::metrics::{kl_divergence, top1_agree};
use crate::tasks::{load_ppl_text, token_windows};
use crate::{EvalError, Result};
use kvslim_cache::policy::tuned::TUNE_FILE_KIND;
use kvslim_cache::policy::{Budget, PolicyFamily};
use kvslim_cache::PolicySpec;
use kvslim_engine::{perplexity, PerplexityOptions, Session};
use kvslim_kernels::ops::log_softmax_at;
use kvslim_models::{Logits, Model, Tokenizer};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Which candidates to search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// Baselines + H2O × 7 score families × sinks {0, 4} × heavy share {¼, ½, ¾}.
    Default,
    /// `window`, `sink`, paper H2O and H2O with `score=decay:0.9`: for tests
    /// and quick looks.
    Tiny,
}

impl std::str::FromStr for Grid {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "default" => Ok(Grid::Default),
            "tiny" => Ok(Grid::Tiny),
            o => Err(format!("grid `{o}` is not `default` or `tiny`")),
        }
    }
}

/// The score families the default grid tries on H2O.
pub const SCORE_FAMILIES: [&str; 7] = ["sum", "norm", "decay:0.9", "decay:0.98", "tova", "vnorm", "persist:16"];

/// The baselines every comparison includes, as budget families at B slots
/// ([`PolicyFamily::at`] owns each split): the recent window, StreamingLLM
/// (4 sinks; only above 4 slots, where it differs from the window), heavy
/// hitters alone, random eviction, and H2O as published (half heavy, half
/// recent, `score=sum`).
pub fn baselines(b: usize) -> Vec<(String, PolicySpec)> {
    let families: &[&str] =
        if b > 4 { &["window", "sink", "heavy", "random", "h2o"] } else { &["window", "heavy", "random", "h2o"] };
    families
        .iter()
        .map(|&f| {
            let spec = PolicyFamily::parse(f).and_then(|p| p.at(b)).expect("baseline families are valid");
            (f.to_string(), spec)
        })
        .collect()
}

/// Every candidate for B slots per (layer, KV head), each exactly B slots,
/// without duplicates (small B makes some splits coincide), baselines first.
pub fn candidate_grid(b: usize, grid: Grid) -> Vec<PolicySpec> {
    let b = b.max(1);
    let mut out: Vec<PolicySpec> = Vec::new();
    let mut push = |s: PolicySpec| {
        if !out.contains(&s) {
            out.push(s);
        }
    };
    for (_, s) in baselines(b) {
        if grid == Grid::Tiny
            && matches!(
                s.token,
                kvslim_cache::policy::TokenPolicySpec::Heavy { .. }
                    | kvslim_cache::policy::TokenPolicySpec::Random { .. }
            )
        {
            continue;
        }
        push(s);
    }
    let (scores, sinks, shares): (&[&str], &[usize], &[(usize, usize)]) = match grid {
        Grid::Default => (&SCORE_FAMILIES, &[0, 4], &[(1, 4), (1, 2), (3, 4)]),
        Grid::Tiny => (&["decay:0.9"], &[0], &[(1, 2)]),
    };
    for &score in scores {
        for &sink in sinks {
            if sink > 0 && b < 2 * sink + 2 {
                continue;
            }
            let rest = b - sink;
            for &(num, den) in shares {
                // heavy share of what the sinks leave, rounded; the recent window gets the rest
                let heavy = ((rest * num + den / 2) / den).clamp(1, rest);
                let recent = rest - heavy;
                let mut s = format!("h2o:heavy={heavy},recent={recent}");
                if sink > 0 {
                    s.push_str(&format!(",sink={sink}"));
                }
                if score != "sum" {
                    s.push_str(&format!(",score={score}"));
                }
                push(PolicySpec::parse(&s).expect("grid specs are valid"));
            }
        }
    }
    if grid == Grid::Default && b >= 4 {
        // the layer/head allocators on the paper split, with plain and age-normalised scores
        for score in ["", ",score=norm"] {
            for alloc in ["pyramid", "ada"] {
                let s = format!("h2o:heavy={},recent={}{score},alloc={alloc}", b - b / 2, b / 2);
                push(PolicySpec::parse(&s).expect("grid specs are valid"));
            }
        }
    }
    out
}

/// What one candidate did on one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct WindowScore {
    /// Predicted tokens (window length − 1).
    pub rows: usize,
    /// Sums over those tokens.
    pub nll_sum: f64,
    pub kl_sum: f64,
    pub top1_sum: f64,
    /// The full cache's NLL sum on the same tokens.
    pub full_nll_sum: f64,
    pub kv_bytes_allocated: usize,
}

impl WindowScore {
    fn add(&mut self, o: &WindowScore) {
        self.rows += o.rows;
        self.nll_sum += o.nll_sum;
        self.kl_sum += o.kl_sum;
        self.top1_sum += o.top1_sum;
        self.full_nll_sum += o.full_nll_sum;
        self.kv_bytes_allocated = self.kv_bytes_allocated.max(o.kv_bytes_allocated);
    }
    fn mean(&self, sum: f64) -> f64 {
        if self.rows == 0 {
            f64::NAN
        } else {
            sum / self.rows as f64
        }
    }
    pub fn kl(&self) -> f64 {
        self.mean(self.kl_sum)
    }
    pub fn nll(&self) -> f64 {
        self.mean(self.nll_sum)
    }
}

/// Scores a candidate on one calibration window; the search only sees this,
/// so it can be tested without a model.
pub trait WindowScorer {
    fn score(&mut self, spec: &PolicySpec, window: usize) -> Result<WindowScore>;
}

/// The real scorer: teacher forcing, every token a decode step, against
/// the full cache. The full cache's logits of one window are kept while the
/// search scores every candidate on it (the search goes window by window),
/// so each window's full run happens once, not once per candidate: half the
/// work of [`score_window`], which runs both. Memory: one window's logits,
/// (L − 1) × vocab floats.
pub struct ModelScorer<'a> {
    model: &'a Model,
    windows: &'a [Vec<u32>],
    full: Option<FullWindow>,
}

/// The full cache's logits (one row per predicted token) on one window.
struct FullWindow {
    window: usize,
    logits: Vec<f32>,
    nll_sum: f64,
}

impl<'a> ModelScorer<'a> {
    pub fn new(model: &'a Model, windows: &'a [Vec<u32>]) -> Self {
        ModelScorer { model, windows, full: None }
    }

    fn full(&mut self, window: usize) -> Result<&FullWindow> {
        if self.full.as_ref().is_none_or(|f| f.window != window) {
            self.full = None;
            let ids = &self.windows[window];
            let v = self.model.config.vocab_size;
            let mut s = Session::new(self.model, &PolicySpec::full(), ids.len(), ids.len())?;
            let mut logits = Vec::with_capacity((ids.len() - 1) * v);
            let mut nll_sum = 0.0;
            for i in 0..ids.len() - 1 {
                let row = s.feed(&ids[i..=i], Logits::Last)?;
                nll_sum -= log_softmax_at(row, ids[i + 1] as usize);
                logits.extend_from_slice(row);
            }
            self.full = Some(FullWindow { window, logits, nll_sum });
        }
        Ok(self.full.as_ref().expect("set above"))
    }
}

impl WindowScorer for ModelScorer<'_> {
    fn score(&mut self, spec: &PolicySpec, window: usize) -> Result<WindowScore> {
        let (model, ids) = (self.model, &self.windows[window]);
        check_window(model, ids)?;
        let v = model.config.vocab_size;
        let full = self.full(window)?;
        let mut s = Session::new(model, spec, ids.len(), ids.len())?;
        let rows = ids.len() - 1;
        let mut out = WindowScore { rows, full_nll_sum: full.nll_sum, ..WindowScore::default() };
        for i in 0..rows {
            let row = s.feed(&ids[i..=i], Logits::Last)?;
            let f = &full.logits[i * v..(i + 1) * v];
            out.nll_sum -= log_softmax_at(row, ids[i + 1] as usize);
            out.kl_sum += kl_divergence(f, row);
            out.top1_sum += f64::from(u8::from(top1_agree(f, row)));
        }
        out.kv_bytes_allocated = s.kv_bytes().kv;
        Ok(out)
    }
}

/// What the engine's perplexity checks before it runs, for windows scored
/// here directly: at least 2 tokens, within the model's context and vocab.
fn check_window(model: &Model, ids: &[u32]) -> Result<()> {
    let c = &model.config;
    if ids.len() < 2 || ids.len() > c.context_len {
        return Err(EvalError::Request(format!(
            "tune: a window of {} tokens does not fit: needs 2..={} (the model's context)",
            ids.len(),
            c.context_len
        )));
    }
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= c.vocab_size) {
        return Err(kvslim_models::Error::TokenOutOfRange { id, vocab: c.vocab_size }.into());
    }
    Ok(())
}

/// One teacher-forced run of `spec` on `ids`, compared with the full cache.
pub fn score_window(model: &Model, spec: &PolicySpec, ids: &[u32]) -> Result<WindowScore> {
    let opts = PerplexityOptions { compare_full: true, ..PerplexityOptions::new(spec.clone()) };
    let r = perplexity(model, ids, &opts, |_, _| {})?;
    let c = r.compare_full.as_ref().expect("compare_full was asked for");
    let rows = r.tokens.saturating_sub(1);
    let n = rows as f64;
    Ok(WindowScore {
        rows,
        nll_sum: r.nll * n,
        kl_sum: c.kl_mean * n,
        top1_sum: c.top1_agreement * n,
        full_nll_sum: c.full_nll * n,
        kv_bytes_allocated: r.kv_bytes_allocated,
    })
}

/// A candidate after the search: how far it got and what it measured on
/// the windows it saw.
#[derive(Clone, Debug, Serialize)]
pub struct CandidateRow {
    pub spec: String,
    /// Windows it was scored on (the last rung it reached).
    pub windows: usize,
    /// 1-based rank: finalists first by KL, then those that left earlier
    /// (later rung first, then KL).
    pub rank: usize,
    pub kl: f64,
    pub nll: f64,
    pub ppl: f64,
    pub top1_agreement: f64,
    pub kv_bytes_allocated: usize,
    #[serde(skip)]
    pub total: WindowScore,
}

/// The windows each rung scores: 1, η, η², … capped at `n`, ending at `n`.
pub fn rung_sizes(n: usize, eta: usize) -> Vec<usize> {
    let eta = eta.max(2);
    let mut out = Vec::new();
    let mut w = 1;
    while out.last() != Some(&n) && n > 0 {
        out.push(w.min(n));
        w = w.saturating_mul(eta);
    }
    out
}

/// How many candidates each rung keeps: all of them on the first, then ⌈k/η⌉.
fn survivors(candidates: usize, rungs: usize, eta: usize) -> Vec<usize> {
    let mut k = candidates;
    let mut out = Vec::with_capacity(rungs);
    for r in 0..rungs {
        if r > 0 {
            k = k.div_ceil(eta.max(2)).max(1);
        }
        out.push(k);
    }
    out
}

/// Window evaluations the whole search will run (for a progress bar).
pub fn planned_evaluations(candidates: usize, n_windows: usize, eta: usize) -> usize {
    let sizes = rung_sizes(n_windows, eta);
    let keep = survivors(candidates, sizes.len(), eta);
    let mut prev = 0;
    sizes
        .iter()
        .zip(&keep)
        .map(|(&w, &k)| {
            let new = (w - prev) * k;
            prev = w;
            new
        })
        .sum()
}

/// KL, then NLL, then grid order: a total order for ranking.
fn by_objective(a: &(usize, WindowScore), b: &(usize, WindowScore)) -> std::cmp::Ordering {
    a.1.kl().total_cmp(&b.1.kl()).then(a.1.nll().total_cmp(&b.1.nll())).then(a.0.cmp(&b.0))
}

/// Successive halving over `candidates` on `n_windows` windows (see the
/// module docs); `progress(done, total)` counts window evaluations. Rows
/// come back ranked, the winner first.
pub fn successive_halving(
    candidates: &[PolicySpec],
    n_windows: usize,
    eta: usize,
    scorer: &mut dyn WindowScorer,
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<CandidateRow>> {
    if candidates.is_empty() || n_windows == 0 {
        return Err(EvalError::Request("tune: nothing to search (no candidates or no windows)".into()));
    }
    let sizes = rung_sizes(n_windows, eta);
    let keep = survivors(candidates.len(), sizes.len(), eta);
    let total_evals = planned_evaluations(candidates.len(), n_windows, eta);
    let mut totals = vec![WindowScore::default(); candidates.len()];
    let mut seen = vec![0usize; candidates.len()];
    let mut reached = vec![0usize; candidates.len()];
    let mut alive: Vec<usize> = (0..candidates.len()).collect();
    let mut done = 0;
    progress(0, total_evals);
    for (rung, (&w, &k)) in sizes.iter().zip(&keep).enumerate() {
        // the best k of the previous rung go on
        if alive.len() > k {
            let mut ranked: Vec<(usize, WindowScore)> = alive.iter().map(|&i| (i, totals[i])).collect();
            ranked.sort_by(by_objective);
            alive = ranked.into_iter().take(k).map(|(i, _)| i).collect();
            alive.sort_unstable();
        }
        // window by window, so a scorer can keep one window's reference
        // run for all candidates (every survivor has seen the same windows)
        let from = alive.iter().map(|&i| seen[i]).min().unwrap_or(w);
        for win in from..w {
            for &i in &alive {
                if seen[i] <= win {
                    totals[i].add(&scorer.score(&candidates[i], win)?);
                    done += 1;
                    progress(done, total_evals);
                }
            }
        }
        for &i in &alive {
            seen[i] = w;
            reached[i] = rung;
        }
    }
    let mut order: Vec<(usize, WindowScore)> = (0..candidates.len()).map(|i| (i, totals[i])).collect();
    order.sort_by(|a, b| reached[b.0].cmp(&reached[a.0]).then(by_objective(a, b)));
    Ok(order
        .into_iter()
        .enumerate()
        .map(|(rank, (i, t))| CandidateRow {
            spec: candidates[i].to_string(),
            windows: seen[i],
            rank: rank + 1,
            kl: t.kl(),
            nll: t.nll(),
            ppl: t.nll().exp(),
            top1_agreement: if t.rows == 0 { f64::NAN } else { t.top1_sum / t.rows as f64 },
            kv_bytes_allocated: t.kv_bytes_allocated,
            total: t,
        })
        .collect())
}

/// Windows cut from a text's tokens, and where they came from.
#[derive(Clone, Debug, Serialize)]
pub struct TextWindows {
    pub path: PathBuf,
    pub seq_len: usize,
    /// The body tokens (BOS stripped) the windows cover: `[start, end)`.
    pub token_range: (usize, usize),
    /// Body tokens in the whole text.
    pub text_tokens: usize,
    /// SHA-256 of the windows' token ids (u32 little-endian, in order).
    pub windows_sha256: String,
    #[serde(skip)]
    pub windows: Vec<Vec<u32>>,
}

/// The text's body tokens (whole text, BOS stripped) and its BOS.
fn body_tokens(path: &Path, tok: &Tokenizer) -> Result<(Vec<u32>, Option<u32>)> {
    let text = load_ppl_text(path)?;
    let bos = tok.prepended_bos();
    let mut ids = tok.encode(&text.text)?;
    if bos.is_some() && ids.first().copied() == bos {
        ids.remove(0);
    }
    Ok((ids, bos))
}

fn hash_windows(windows: &[Vec<u32>]) -> String {
    let mut h = Sha256::new();
    for w in windows {
        for id in w {
            h.update(id.to_le_bytes());
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// `n` windows of `seq_len` tokens (BOS + body, as evaluation's `ppl:` task
/// cuts them) from the body tokens of `path` starting at `skip` (`None`:
/// the start of the second half). Errors when the text is too short.
pub fn calibration_windows(
    path: &Path,
    tok: &Tokenizer,
    seq_len: usize,
    skip: Option<usize>,
    n: usize,
) -> Result<TextWindows> {
    let (body, bos) = body_tokens(path, tok)?;
    let skip = skip.unwrap_or(body.len() / 2);
    cut(path, &body, bos, seq_len, skip, n)
}

/// The first `n` windows of `path`, as `ppl:FILE,seq_len=L,limit=n` takes
/// them: what a held-out evaluation reads.
pub fn evaluation_windows(path: &Path, tok: &Tokenizer, seq_len: usize, n: usize) -> Result<TextWindows> {
    let (body, bos) = body_tokens(path, tok)?;
    cut(path, &body, bos, seq_len, 0, n)
}

fn cut(path: &Path, body: &[u32], bos: Option<u32>, seq_len: usize, skip: usize, n: usize) -> Result<TextWindows> {
    if seq_len < 2 || n == 0 {
        return Err(EvalError::Request("tune: windows need seq_len ≥ 2 and a count ≥ 1".into()));
    }
    let per = seq_len - usize::from(bos.is_some());
    let need = per * n;
    if skip.saturating_add(need) > body.len() {
        return Err(EvalError::File {
            path: path.into(),
            reason: format!(
                "{n} windows of {seq_len} tokens from token {skip} need {need} tokens, but the text has {} after it",
                body.len().saturating_sub(skip)
            ),
        });
    }
    let windows = token_windows(&body[skip..skip + need], seq_len, bos, Some(n));
    Ok(TextWindows {
        path: path.into(),
        seq_len,
        token_range: (skip, skip + need),
        text_tokens: body.len(),
        windows_sha256: hash_windows(&windows),
        windows,
    })
}

/// Refuses an evaluation that would read tokens tuning read: the same file
/// (by canonical path) with overlapping token ranges.
pub fn check_disjoint(tune: &TextWindows, eval: &TextWindows) -> Result<()> {
    let same = match (tune.path.canonicalize(), eval.path.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => tune.path == eval.path,
    };
    let (t, e): (Range<usize>, Range<usize>) =
        (tune.token_range.0..tune.token_range.1, eval.token_range.0..eval.token_range.1);
    if same && t.start < e.end && e.start < t.end {
        return Err(EvalError::Request(format!(
            "the evaluation text {} is the calibration text, and its evaluation windows (tokens {}..{}) overlap the tune windows (tokens {}..{}): \
             tuning must never read evaluation text; move the tune windows past them (--skip-tokens {}) or evaluate fewer windows",
            eval.path.display(),
            e.start,
            e.end,
            t.start,
            t.end,
            e.end
        )));
    }
    Ok(())
}

/// How to tune.
#[derive(Clone, Debug)]
pub struct TuneConfig {
    pub seq_len: usize,
    /// Windows the finalists are scored on.
    pub windows: usize,
    /// Successive halving's η (keep 1/η per rung, η× windows).
    pub eta: usize,
    pub grid: Grid,
}

/// One budget's search.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetSearch {
    pub budget: String,
    pub budget_slots: usize,
    pub candidates: Vec<CandidateRow>,
}

/// Runs the search at `budget` on `windows` (resolved against `seq_len`).
pub fn search_budget(
    budget: Budget,
    cfg: &TuneConfig,
    scorer: &mut dyn WindowScorer,
    progress: impl FnMut(usize, usize),
) -> Result<BudgetSearch> {
    let b = budget.resolve(cfg.seq_len).max(1);
    let cands = candidate_grid(b, cfg.grid);
    let rows = successive_halving(&cands, cfg.windows, cfg.eta, scorer, progress)?;
    Ok(BudgetSearch { budget: budget.to_string(), budget_slots: b, candidates: rows })
}

/// For a quality target: the searches from the smallest budget up, stopping
/// at the first whose winner's KL is at most `max_kl`. Returns every search
/// run and the index of the one that met the target (`None`: none did).
pub fn search_for_target(
    budgets: &[Budget],
    max_kl: f64,
    cfg: &TuneConfig,
    scorer: &mut dyn WindowScorer,
    mut progress: impl FnMut(&str, usize, usize),
) -> Result<(Vec<BudgetSearch>, Option<usize>)> {
    let mut sorted: Vec<Budget> = budgets.to_vec();
    sorted.sort_by_key(|b| b.resolve(cfg.seq_len));
    let mut out = Vec::new();
    for b in sorted {
        let label = b.to_string();
        let s = search_budget(b, cfg, scorer, |d, t| progress(&label, d, t))?;
        let met = s.candidates[0].kl <= max_kl;
        out.push(s);
        if met {
            let i = out.len() - 1;
            return Ok((out, Some(i)));
        }
    }
    Ok((out, None))
}

/// One row of a held-out comparison.
#[derive(Clone, Debug, Serialize)]
pub struct HeldOutRow {
    pub label: String,
    pub spec: String,
    pub kl: f64,
    pub nll: f64,
    pub ppl: f64,
    pub top1_agreement: f64,
    pub kv_bytes_allocated: usize,
}

/// The tuned spec against the baselines at the same B on windows tuning did
/// not see; `progress(done, total)` counts window evaluations.
pub fn held_out(
    model: &Model,
    tuned: &PolicySpec,
    budget_slots: usize,
    eval: &TextWindows,
    mut progress: impl FnMut(usize, usize),
) -> Result<(Vec<HeldOutRow>, f64)> {
    let mut specs = vec![("tuned".to_string(), tuned.clone())];
    specs.extend(baselines(budget_slots));
    let total = specs.len() * eval.windows.len();
    let mut scorer = ModelScorer::new(model, &eval.windows);
    let mut totals = vec![WindowScore::default(); specs.len()];
    let mut done = 0;
    for w in 0..eval.windows.len() {
        for (t, (_, spec)) in totals.iter_mut().zip(&specs) {
            t.add(&scorer.score(spec, w)?);
            done += 1;
            progress(done, total);
        }
    }
    let full_nll = totals[0].full_nll_sum / totals[0].rows as f64;
    let rows = specs
        .into_iter()
        .zip(&totals)
        .map(|((label, spec), t)| HeldOutRow {
            label,
            spec: spec.to_string(),
            kl: t.kl(),
            nll: t.nll(),
            ppl: t.nll().exp(),
            top1_agreement: t.top1_sum / t.rows as f64,
            kv_bytes_allocated: t.kv_bytes_allocated,
        })
        .collect();
    Ok((rows, full_nll))
}

/// The file `kvslim tune --out` writes; `tuned:file=PATH` reads its `kind`
/// and `spec` ([`kvslim_cache::policy::tuned`]), the rest is the record of
/// how it was chosen.
#[derive(Clone, Debug, Serialize)]
pub struct TuneFile {
    pub kind: &'static str,
    pub version: u32,
    /// The chosen policy, in the one grammar, for `seq_len`-token sequences.
    pub spec: String,
    pub objective: &'static str,
    pub model: String,
    pub budget: String,
    pub budget_slots: usize,
    pub seq_len: usize,
    pub kl: f64,
    pub nll: f64,
    pub ppl: f64,
    pub top1_agreement: f64,
    pub kv_bytes_allocated: usize,
    pub full_nll: f64,
    pub full_ppl: f64,
    /// `--max-kl`: the target and whether the chosen budget met it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_kl: Option<f64>,
    pub calibration: TextWindows,
    pub search: SearchRecord,
    /// Every budget searched (one unless `--max-kl`), every candidate.
    pub searches: Vec<BudgetSearch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_out: Option<HeldOutRecord>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SearchRecord {
    pub method: &'static str,
    pub eta: usize,
    pub rungs: Vec<usize>,
    pub grid: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct HeldOutRecord {
    pub text: TextWindows,
    pub full_nll: f64,
    pub full_ppl: f64,
    pub rows: Vec<HeldOutRow>,
}

/// The objective, as the file states it.
pub const OBJECTIVE: &str = "mean KL(full||policy) per predicted token over the calibration windows (teacher forced, every token a decode step); ties by NLL";

impl TuneFile {
    /// The record of `search` (whose first candidate is the chosen one).
    pub fn new(
        model: &str,
        cfg: &TuneConfig,
        calibration: TextWindows,
        searches: Vec<BudgetSearch>,
        chosen: usize,
    ) -> Self {
        let s = &searches[chosen];
        let best = &s.candidates[0];
        let full_nll = best.total.full_nll_sum / best.total.rows as f64;
        TuneFile {
            kind: TUNE_FILE_KIND,
            version: 1,
            spec: best.spec.clone(),
            objective: OBJECTIVE,
            model: model.to_string(),
            budget: s.budget.clone(),
            budget_slots: s.budget_slots,
            seq_len: cfg.seq_len,
            kl: best.kl,
            nll: best.nll,
            ppl: best.ppl,
            top1_agreement: best.top1_agreement,
            kv_bytes_allocated: best.kv_bytes_allocated,
            full_nll,
            full_ppl: full_nll.exp(),
            max_kl: None,
            calibration,
            search: SearchRecord {
                method: "successive halving",
                eta: cfg.eta,
                rungs: rung_sizes(cfg.windows, cfg.eta),
                grid: format!("{:?}", cfg.grid).to_lowercase(),
            },
            searches,
            held_out: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// KL per candidate per window from a table; counts calls.
    struct Fake {
        kl: HashMap<String, Vec<f64>>,
        calls: Vec<(String, usize)>,
    }

    impl WindowScorer for Fake {
        fn score(&mut self, spec: &PolicySpec, window: usize) -> Result<WindowScore> {
            let s = spec.to_string();
            self.calls.push((s.clone(), window));
            let kl = self.kl[&s][window];
            Ok(WindowScore {
                rows: 10,
                nll_sum: 10.0 * (1.0 + kl),
                kl_sum: 10.0 * kl,
                top1_sum: 9.0,
                full_nll_sum: 10.0,
                kv_bytes_allocated: 64,
            })
        }
    }

    fn specs(n: usize) -> Vec<PolicySpec> {
        (1..=n).map(|i| PolicySpec::parse(&format!("window:recent={i}")).unwrap()).collect()
    }

    #[test]
    fn rungs_grow_by_eta_and_end_at_all_windows() {
        assert_eq!(rung_sizes(8, 3), vec![1, 3, 8]);
        assert_eq!(rung_sizes(9, 3), vec![1, 3, 9]);
        assert_eq!(rung_sizes(1, 3), vec![1]);
        assert_eq!(rung_sizes(4, 2), vec![1, 2, 4]);
        assert_eq!(rung_sizes(0, 3), Vec::<usize>::new());
        assert_eq!(survivors(46, 3, 3), vec![46, 16, 6]);
        // 46 on 1 window, 16 on 2 more, 6 on 5 more
        assert_eq!(planned_evaluations(46, 8, 3), 46 + 16 * 2 + 6 * 5);
    }

    #[test]
    fn halving_keeps_the_best_third_and_finds_the_winner() {
        let c = specs(9);
        // candidate i's KL on window w: the last candidate is best on average,
        // the second looks best on window 0 only
        let mut kl = HashMap::new();
        for (i, s) in c.iter().enumerate() {
            let v: Vec<f64> = (0..3)
                .map(|w| match (i, w) {
                    (1, 0) => 0.01,
                    (1, _) => 0.9,
                    (8, _) => 0.05,
                    _ => 0.5 + i as f64 * 0.01,
                })
                .collect();
            kl.insert(s.to_string(), v);
        }
        let mut f = Fake { kl, calls: Vec::new() };
        let mut last = (0, 0);
        let rows = successive_halving(&c, 3, 3, &mut f, |d, t| last = (d, t)).unwrap();
        assert_eq!(rows[0].spec, "window:recent=9", "the winner over all windows");
        assert_eq!(rows[0].windows, 3);
        assert!((rows[0].kl - 0.05).abs() < 1e-12);
        // 9 on window 0, then the best 3 on windows 1 and 2: 9 + 3·2 calls, never twice
        assert_eq!(f.calls.len(), 9 + 6);
        let mut uniq = f.calls.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), f.calls.len());
        assert_eq!(last, (15, 15));
        // the early leader was kept, then lost on the longer rung
        assert_eq!(rows[1].spec, "window:recent=1");
        let r2 = rows.iter().find(|r| r.spec == "window:recent=2").unwrap();
        assert_eq!((r2.windows, r2.rank), (3, 3));
        // those eliminated after one window come last, ranked by their KL
        assert!(rows[3..].iter().all(|r| r.windows == 1));
        assert!(rows[3..].windows(2).all(|p| p[0].kl <= p[1].kl));
        assert_eq!(rows.iter().map(|r| r.rank).collect::<Vec<_>>(), (1..=9).collect::<Vec<_>>());
    }

    #[test]
    fn ties_break_by_nll_then_grid_order() {
        let c = specs(3);
        let kl = c.iter().map(|s| (s.to_string(), vec![0.1])).collect();
        let mut f = Fake { kl, calls: Vec::new() };
        let rows = successive_halving(&c, 1, 3, &mut f, |_, _| {}).unwrap();
        let got: Vec<&str> = rows.iter().map(|r| r.spec.as_str()).collect();
        assert_eq!(got, ["window:recent=1", "window:recent=2", "window:recent=3"]);
        assert!(successive_halving(&[], 1, 3, &mut f, |_, _| {}).is_err());
    }

    #[test]
    fn quality_target_picks_the_smallest_budget_that_meets_it() {
        // the fake's KL falls with the budget: window:recent=B has KL 1/B
        struct ByBudget;
        impl WindowScorer for ByBudget {
            fn score(&mut self, spec: &PolicySpec, _w: usize) -> Result<WindowScore> {
                let b = spec.budget(100).unwrap() as f64;
                Ok(WindowScore { rows: 1, kl_sum: 1.0 / b, ..WindowScore::default() })
            }
        }
        let cfg = TuneConfig { seq_len: 100, windows: 2, eta: 3, grid: Grid::Tiny };
        let budgets: Vec<Budget> = ["40%", "5%", "10%", "20%"].iter().map(|b| b.parse().unwrap()).collect();
        let (runs, met) = search_for_target(&budgets, 0.08, &cfg, &mut ByBudget, |_, _, _| {}).unwrap();
        // 5 → 0.2, 10 → 0.1, 20 → 0.05 ≤ 0.08: stops there, ascending
        assert_eq!(runs.iter().map(|r| r.budget_slots).collect::<Vec<_>>(), vec![5, 10, 20]);
        assert_eq!(met, Some(2));
        let (runs, met) = search_for_target(&budgets, 0.001, &cfg, &mut ByBudget, |_, _, _| {}).unwrap();
        assert_eq!((runs.len(), met), (4, None));
    }

    #[test]
    fn every_candidate_holds_exactly_b_slots() {
        for b in [1, 3, 8, 10, 51, 102, 205] {
            for grid in [Grid::Default, Grid::Tiny] {
                let g = candidate_grid(b, grid);
                for s in &g {
                    assert_eq!(s.budget(1000), Some(b), "{s} at B={b}");
                    assert_eq!(PolicySpec::parse(&s.to_string()).unwrap(), *s);
                }
                let mut names: Vec<String> = g.iter().map(|s| s.to_string()).collect();
                names.sort();
                names.dedup();
                assert_eq!(names.len(), g.len(), "no duplicates at B={b}");
            }
        }
        let g = candidate_grid(102, Grid::Default);
        // 5 baselines + 7 families × 2 sink settings × 3 splits, less the paper H2O
        // counted twice, + 2 allocators × 2 score families
        assert_eq!(g.len(), 5 + 7 * 2 * 3 - 1 + 4);
        let names: Vec<String> = g.iter().map(|s| s.to_string()).collect();
        for want in [
            "window:recent=102",
            "sink:sink=4,recent=98",
            "heavy:heavy=102",
            "random:budget=102,recent=51,seed=0",
            "h2o:heavy=51,recent=51",
            "h2o:heavy=26,recent=76,score=decay:0.9",
            "h2o:heavy=74,recent=24,sink=4,score=persist:16",
            "h2o:heavy=51,recent=51,alloc=pyramid:0.25",
            "h2o:heavy=51,recent=51,score=norm,alloc=ada:0.2",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
        }
        assert_eq!(candidate_grid(102, Grid::Tiny).len(), 4);
    }

    #[test]
    fn tune_and_eval_windows_never_overlap() {
        let path = std::env::temp_dir().join(format!("kvslim-tune-split-{}.txt", std::process::id()));
        std::fs::write(&path, "x").unwrap();
        let w = |start: usize, end: usize| TextWindows {
            path: path.clone(),
            seq_len: 4,
            token_range: (start, end),
            text_tokens: 100,
            windows_sha256: String::new(),
            windows: Vec::new(),
        };
        // the default split: eval windows from token 0, tune from the second half
        check_disjoint(&w(50, 80), &w(0, 48)).unwrap();
        check_disjoint(&w(50, 80), &w(0, 50)).unwrap();
        let e = check_disjoint(&w(50, 80), &w(0, 51)).unwrap_err().to_string();
        assert!(e.contains("overlap") && e.contains("--skip-tokens 51"), "{e}");
        // another file may overlap in token numbers
        let mut other = w(0, 60);
        other.path = std::env::temp_dir().join("kvslim-tune-other.txt");
        check_disjoint(&w(50, 80), &other).unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn windows_are_cut_from_the_offset_and_hashed() {
        let body: Vec<u32> = (0..100).collect();
        let p = Path::new("t.txt");
        let t = cut(p, &body, Some(1000), 5, 50, 3).unwrap();
        assert_eq!(t.token_range, (50, 62));
        assert_eq!(t.windows, vec![vec![1000, 50, 51, 52, 53], vec![1000, 54, 55, 56, 57], vec![1000, 58, 59, 60, 61]]);
        assert_eq!(t.windows_sha256.len(), 64);
        assert_ne!(t.windows_sha256, cut(p, &body, Some(1000), 5, 51, 3).unwrap().windows_sha256);
        let e = cut(p, &body, None, 10, 95, 1).unwrap_err().to_string();
        assert!(e.contains("t.txt") && e.contains("need 10 tokens") && e.contains("has 5"), "{e}");
    }
}
