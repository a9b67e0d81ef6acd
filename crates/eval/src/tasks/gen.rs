//! `gen:FILE[,max_tokens=N]`: greedy generation from each prompt
//! ([`load_gen_prompts`]) under the policy, compared with the full cache's
//! greedy output: `first_div` (mean first step where they differ, capped
//! at the token limit), `prefix_frac` (mean identical-prefix fraction of
//! the limit), `agree_frac` (positional agreement), `identical` (share of
//! prompts with the same output). Budgets resolve against each prompt.
//! Cells add `ttft` (prompt prefill and first token) and `tpot` (seconds
//! per later token) to their timings, means over prompts.

use super::kind::{file_spec, positive, set_option, unless_default, Kind, KvPeak, Prepared, Task};
use super::text::load_gen_prompts;
use crate::budget::PolicySource;
use crate::cell::{greedy, par_blocks, Cell};
use crate::error::{EvalError, Result};
use crate::metrics::{first_divergence, identical_prefix_fraction, positional_agreement};
use kvslim_engine::generate;
use kvslim_models::{Model, Tokenizer};
use std::path::{Path, PathBuf};

pub const DEFAULT_GEN_TOKENS: usize = 128;

pub const KIND: Kind = Kind {
    names: &["gen"],
    file: true,
    extensions: &[],
    options: "max_tokens, limit",
    headline: &["first_div", "prefix_frac", "agree_frac"],
    new: |_, path| Box::new(Gen { path, max_tokens: DEFAULT_GEN_TOKENS }),
};

/// Prompts, one per line or jsonl `{"prompt"}`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gen {
    pub path: PathBuf,
    pub max_tokens: usize,
}

impl Task for Gen {
    fn name(&self) -> &'static str {
        "gen"
    }

    fn set(&mut self, key: &str, vals: &[&str]) -> Result<bool, String> {
        set_option(&mut self.max_tokens, key, "max_tokens", vals, positive)
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn render(&self, short: bool) -> String {
        file_spec("gen", &self.path, short, &[unless_default("max_tokens", self.max_tokens, DEFAULT_GEN_TOKENS)])
    }

    fn prepare(&self, model: &Model, tok: &Tokenizer, limit: Option<usize>) -> Result<Box<dyn Prepared>> {
        let mut prompts = load_gen_prompts(&self.path)?;
        prompts.truncate(limit.unwrap_or(usize::MAX));
        let ctx = model.config.context_len;
        let mut out = Vec::with_capacity(prompts.len());
        for p in prompts {
            let ids = tok.encode(&p.prompt)?;
            if ids.is_empty() || ids.len() >= ctx {
                return Err(EvalError::Request(format!(
                    "gen prompt `{}` has {} tokens; the model's context is {ctx}",
                    p.prompt.chars().take(40).collect::<String>(),
                    ids.len()
                )));
            }
            out.push((ids, p.max_tokens.unwrap_or(self.max_tokens)));
        }
        Ok(Box::new(Prompts { prompts: out, reference: None }))
    }
}

/// Prompt ids and their token limits; the full cache's outputs, made by
/// the task's first cell.
struct Prompts {
    prompts: Vec<(Vec<u32>, usize)>,
    reference: Option<Vec<Vec<u32>>>,
}

impl Prepared for Prompts {
    fn items(&self) -> usize {
        self.prompts.len()
    }

    fn run(&mut self, cell: &mut Cell<'_>) -> Result<KvPeak> {
        let (model, tok, policy, prompts) = (cell.model, cell.tok, cell.policy, &self.prompts);
        let mut peak = KvPeak::default();
        if self.reference.is_none() {
            let full = kvslim_cache::PolicySpec::full();
            let refs = par_blocks(
                prompts.len(),
                |i| Ok(generate(model, &prompts[i].0, &greedy(full.clone(), prompts[i].1, tok), |_| true)?.token_ids),
                |_| {},
            )?;
            self.reference = Some(refs);
        }
        let refs = self.reference.as_ref().expect("set above");
        let gens = par_blocks(
            prompts.len(),
            |i| {
                let (ids, n) = &prompts[i];
                Ok(generate(model, ids, &greedy(policy.spec_for(ids.len())?, *n, tok), |_| true)?)
            },
            |d| (cell.report)(d, prompts.len()),
        )?;
        let (mut div, mut pre, mut agree, mut same) = (0.0, 0.0, 0.0, 0usize);
        for ((g, r), (_, n)) in gens.iter().zip(refs).zip(prompts.iter()) {
            let d = first_divergence(r, &g.token_ids);
            div += d.unwrap_or(*n).min(*n) as f64;
            pre += identical_prefix_fraction(r, &g.token_ids, *n);
            agree += positional_agreement(r, &g.token_ids, *n);
            same += usize::from(d.is_none());
            peak.see(g.kv_bytes.kv, g.kv_bytes.metadata);
        }
        let k = gens.len().max(1) as f64;
        // latency: prompt prefill + first token, then per later token
        let ttft = gens.iter().map(|g| g.time_to_first_token_s).sum::<f64>() / k;
        let (dec_s, dec_n) =
            gens.iter().fold((0.0, 0usize), |(s, n), g| (s + g.decode_s, n + g.token_ids.len().saturating_sub(1)));
        let row = &mut *cell.row;
        row.timings.insert("ttft".into(), ttft);
        if dec_n > 0 {
            row.timings.insert("tpot".into(), dec_s / dec_n as f64);
        }
        row.metrics.insert("first_div".into(), div / k);
        row.metrics.insert("prefix_frac".into(), pre / k);
        row.metrics.insert("agree_frac".into(), agree / k);
        row.metrics.insert("identical".into(), same as f64 / k);
        Ok(peak)
    }
}
