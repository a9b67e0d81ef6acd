//! Log-likelihood scoring of continuations under a cache policy, and
//! multiple-choice accuracy from it.

use crate::budget::PolicySource;
use crate::error::{EvalError, Result};
use kvslim_engine::sampling::argmax;
use kvslim_engine::Session;
use kvslim_kernels::ops::log_softmax_at;
use kvslim_models::{Logits, Model, Tokenizer};
use rayon::prelude::*;

/// How a context + continuation sequence goes through the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScoreMode {
    /// Every token is its own decode step, so the policy acts at every
    /// position of context and continuation: what H2O's zero-shot
    /// evaluation simulates with its attention mask. The default.
    #[default]
    Decode,
    /// The context is one prefill (the policy's prefill rule picks what
    /// stays after it, e.g. H2O `prefill=full`), then the continuation is
    /// decoded token by token: how generation would see it.
    PrefillContext,
    /// One forward over the whole sequence with every row's logits. Within
    /// a chunk attention is full, so only the full cache is measured
    /// faithfully; the fast path for `full` baselines.
    Prefill,
}

parse_names! {
    ScoreMode, "score mode":
    "decode" => ScoreMode::Decode,
    "prefill-context" => ScoreMode::PrefillContext,
    "prefill" => ScoreMode::Prefill,
}

/// How a multiple-choice item's choices are run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scoring {
    /// The context once, each choice on a fork of its cache, a block of
    /// items batched ([`crate::forked::score_items`]); percentage budgets
    /// resolve against context + the item's longest choice. The default.
    #[default]
    Forked,
    /// One session per choice over context + choice ([`score_choices`]);
    /// percentage budgets resolve against each choice's own sequence.
    PerChoice,
}

parse_names! { Scoring, "scoring": "forked" => Scoring::Forked, "per-choice" => Scoring::PerChoice }

/// A continuation to score: its token ids and its length in characters
/// (for length-normalised accuracy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub ids: Vec<u32>,
    pub n_chars: usize,
}

/// The log-likelihood of one continuation given the context.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChoiceScore {
    /// Σ ln p(continuation token | everything before it), nats.
    pub logprob_sum: f64,
    pub n_tokens: usize,
    pub n_chars: usize,
    /// Every continuation token was the model's top-1.
    pub greedy: bool,
    /// KV bytes the session had allocated.
    pub kv_bytes: usize,
    /// Metadata bytes (positions, scores) of the session.
    pub kv_metadata_bytes: usize,
}

impl ChoiceScore {
    /// Log-likelihood per character (lm-evaluation-harness's `acc_norm`).
    pub fn per_char(&self) -> f64 {
        self.logprob_sum / self.n_chars.max(1) as f64
    }
}

/// Scores each continuation after `context_ids` under `policy` (one
/// session per choice, choices in parallel). Percentage budgets resolve
/// against the whole sequence (context + that continuation). When a
/// sequence exceeds the model's context, the context is cut from the left
/// (as lm-evaluation-harness does); a continuation that alone fills the
/// context is an error.
pub fn score_choices<P: PolicySource + ?Sized>(
    model: &Model,
    policy: &P,
    context_ids: &[u32],
    choices: &[Choice],
    mode: ScoreMode,
) -> Result<Vec<ChoiceScore>> {
    if context_ids.is_empty() {
        return Err(EvalError::Request("scoring needs a non-empty context (BOS at least)".into()));
    }
    choices.par_iter().map(|c| score_one(model, policy, context_ids, c, mode)).collect()
}

fn score_one<P: PolicySource + ?Sized>(
    model: &Model,
    policy: &P,
    context: &[u32],
    choice: &Choice,
    mode: ScoreMode,
) -> Result<ChoiceScore> {
    let cont = &choice.ids;
    if cont.is_empty() {
        return Err(EvalError::Request("a continuation has no tokens".into()));
    }
    let max = model.config.context_len;
    if cont.len() >= max {
        return Err(EvalError::Request(format!(
            "a continuation of {} tokens does not fit the model's context of {max}",
            cont.len()
        )));
    }
    let keep = context.len().min(max - cont.len());
    let context = &context[context.len() - keep..];
    let seq: Vec<u32> = context.iter().chain(cont.iter()).copied().collect();
    let n = seq.len();
    let spec = policy.spec_for(n)?;
    let mut s = Session::new(model, &spec, n, n)?;
    let v = model.config.vocab_size;
    // logits at position i predict seq[i + 1]; the first continuation
    // token is predicted at the last context position
    let first = context.len() - 1;
    let mut logprob_sum = 0.0;
    let mut greedy = true;
    let mut take = |row: &[f32], target: u32| {
        logprob_sum += log_softmax_at(row, target as usize);
        greedy &= argmax(row) == target;
    };
    match mode {
        ScoreMode::Decode => {
            for i in 0..n - 1 {
                let want = if i >= first { Logits::Last } else { Logits::None };
                let logits = s.feed(&seq[i..i + 1], want)?;
                if i >= first {
                    take(logits, seq[i + 1]);
                }
            }
        }
        ScoreMode::PrefillContext => {
            take(s.feed(context, Logits::Last)?, seq[first + 1]);
            for i in first + 1..n - 1 {
                take(s.feed(&seq[i..i + 1], Logits::Last)?, seq[i + 1]);
            }
        }
        ScoreMode::Prefill => {
            let logits = s.feed(&seq[..n - 1], Logits::All)?;
            for i in first..n - 1 {
                take(&logits[i * v..(i + 1) * v], seq[i + 1]);
            }
        }
    }
    let bytes = s.kv_bytes();
    Ok(ChoiceScore {
        logprob_sum,
        n_tokens: cont.len(),
        n_chars: choice.n_chars,
        greedy,
        kv_bytes: bytes.kv,
        kv_metadata_bytes: bytes.metadata,
    })
}

/// One item ready to score: choice i's full text is
/// `context + continuations[i]`; the model is scored on the continuation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McItem {
    pub context: String,
    pub continuations: Vec<String>,
    pub gold: usize,
}

impl McItem {
    /// Joins `query + delimiter + choice` and moves the whitespace at the end
    /// of `query + delimiter` to the front of every continuation (as
    /// lm-evaluation-harness does), so a tokenizer sees `" word"` at the
    /// boundary instead of a dangling space.
    pub fn from_parts(query: &str, delimiter: &str, choices: &[String], gold: usize) -> Self {
        let joined = format!("{query}{delimiter}");
        let context = joined.trim_end_matches(|c: char| c.is_whitespace());
        let moved = &joined[context.len()..];
        McItem {
            context: context.to_string(),
            continuations: choices.iter().map(|c| format!("{moved}{c}")).collect(),
            gold,
        }
    }
}

/// Tokenizes an item the way lm-evaluation-harness does: the whole text
/// `context + continuation` is encoded and the context's own encoding is
/// cut off its front (by length), so merges across the boundary are the
/// whole text's. When that cut leaves nothing, the continuation is encoded
/// on its own instead (BOS removed). An empty context becomes BOS (or EOS).
/// `n_chars` counts the continuation's characters, its leading space
/// included, as lm-eval does.
pub fn encode_item(tok: &Tokenizer, item: &McItem) -> Result<(Vec<u32>, Vec<Choice>)> {
    let ctx = tok.encode(&item.context)?;
    let mut choices = Vec::with_capacity(item.continuations.len());
    for c in &item.continuations {
        let whole = tok.encode(&format!("{}{c}", item.context))?;
        // (when a merge across the boundary changed the context's last
        // tokens, this is still lm-eval's cut)
        let ids = if whole.len() > ctx.len() { whole[ctx.len()..].to_vec() } else { tok.encode_after(c)? };
        choices.push(Choice { ids, n_chars: c.chars().count() });
    }
    if ctx.is_empty() {
        // an empty context (no BOS added): condition on BOS or EOS, as lm-eval does with EOT
        return Ok((tok.bos.or_else(|| tok.eos.first().copied()).into_iter().collect(), choices));
    }
    Ok((ctx, choices))
}

/// The choice with the highest log-likelihood (first on ties).
pub fn predict(scores: &[ChoiceScore]) -> usize {
    argmax_by(scores, |s| s.logprob_sum)
}

/// The choice with the highest log-likelihood per character (first on ties).
pub fn predict_norm(scores: &[ChoiceScore]) -> usize {
    argmax_by(scores, ChoiceScore::per_char)
}

fn argmax_by(scores: &[ChoiceScore], f: impl Fn(&ChoiceScore) -> f64) -> usize {
    let mut best = 0;
    for (i, s) in scores.iter().enumerate() {
        if f(s) > f(&scores[best]) {
            best = i;
        }
    }
    best
}

/// Running accuracy over items.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct McTally {
    pub items: usize,
    pub correct: usize,
    pub correct_norm: usize,
    /// Σ log-likelihood of the gold continuation.
    pub gold_logprob: f64,
}

impl McTally {
    /// Adds an item's scores; returns (correct, correct by acc_norm).
    pub fn add(&mut self, gold: usize, scores: &[ChoiceScore]) -> (bool, bool) {
        let (a, b) = (predict(scores) == gold, predict_norm(scores) == gold);
        self.items += 1;
        self.correct += usize::from(a);
        self.correct_norm += usize::from(b);
        self.gold_logprob += scores.get(gold).map_or(0.0, |s| s.logprob_sum);
        (a, b)
    }

    pub fn merge(&mut self, o: &McTally) {
        self.items += o.items;
        self.correct += o.correct;
        self.correct_norm += o.correct_norm;
        self.gold_logprob += o.gold_logprob;
    }

    pub fn acc(&self) -> f64 {
        self.correct as f64 / self.items.max(1) as f64
    }

    pub fn acc_norm(&self) -> f64 {
        self.correct_norm as f64 / self.items.max(1) as f64
    }

    /// Standard error of `acc` (binomial).
    pub fn acc_stderr(&self) -> f64 {
        let n = self.items.max(1) as f64;
        let p = self.acc();
        (p * (1.0 - p) / (n - 1.0).max(1.0)).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cs(lp: f64, chars: usize) -> ChoiceScore {
        ChoiceScore { logprob_sum: lp, n_tokens: 1, n_chars: chars, greedy: false, kv_bytes: 0, kv_metadata_bytes: 0 }
    }

    #[test]
    fn acc_and_acc_norm_on_hand_made_items() {
        // item 1: the long gold choice loses on raw log-likelihood but wins per character
        let item1 = [cs(-10.0, 40), cs(-6.0, 5)];
        assert_eq!(predict(&item1), 1);
        assert_eq!(predict_norm(&item1), 0); // -0.25/char vs -1.2/char
                                             // item 2: both agree on choice 2
        let item2 = [cs(-9.0, 10), cs(-8.0, 10), cs(-1.0, 10)];
        // item 3: ties go to the first choice
        let item3 = [cs(-2.0, 4), cs(-2.0, 4)];
        let mut t = McTally::default();
        assert_eq!(t.add(0, &item1), (false, true));
        assert_eq!(t.add(2, &item2), (true, true));
        assert_eq!(t.add(1, &item3), (false, false));
        assert_eq!((t.items, t.correct, t.correct_norm), (3, 1, 2));
        assert!((t.acc() - 1.0 / 3.0).abs() < 1e-12);
        assert!((t.acc_norm() - 2.0 / 3.0).abs() < 1e-12);
        assert!((t.gold_logprob - (-10.0 - 1.0 - 2.0)).abs() < 1e-12);
        let mut u = McTally::default();
        u.merge(&t);
        u.merge(&t);
        assert_eq!(u.items, 6);
        assert!((u.acc() - t.acc()).abs() < 1e-12);
        assert_eq!("prefill-context".parse::<ScoreMode>(), Ok(ScoreMode::PrefillContext));
        assert!("x".parse::<ScoreMode>().is_err());
    }
}
