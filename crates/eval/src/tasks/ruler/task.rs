//! The RULER tasks as task kinds: `passkey`, `niah_*`, `vt`, `cwe`, each
//! `[:lengths=A,B,..][,depths=X,Y,..][,per_cell=N][,seed=S][,max_tokens=N][,haystack=…]`.
//! A cell is a greedy answer after each prompt; `acc` = share of items
//! whose output holds every expected answer (with `acc_stderr`), `recall`
//! = mean share of answers found, plus `acc_len{L}` and `acc_depth{D}`
//! breakdowns.

use super::{answers_found, try_ruler_items, Haystack, RulerConfig, RulerTask};
use crate::cell::Cell;
use crate::error::{EvalError, Result};
use crate::tasks::kind::{number, positive, single, GenerationItems, Kind, KvPeak, Prepared, Task};
use kvslim_models::{Model, Tokenizer};
use std::collections::BTreeMap;
use std::path::PathBuf;

pub const KIND: Kind = Kind {
    names: &["passkey", "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe"],
    file: false,
    extensions: &[],
    options: "lengths, depths, per_cell, seed, haystack, max_tokens, limit",
    headline: &["acc"],
    new: |name, _| {
        let task = RulerTask::from_name(name).expect("a registered name");
        Box::new(Ruler { config: RulerConfig::new(task), max_tokens: task.default_max_tokens() })
    },
};

/// Which items to make, and how many tokens an answer may take.
#[derive(Clone, Debug, PartialEq)]
pub struct Ruler {
    pub config: RulerConfig,
    pub max_tokens: usize,
}

fn list<T: std::str::FromStr>(key: &str, vals: &[&str]) -> Result<Vec<T>, String> {
    vals.iter().map(|v| number(key, &[v])).collect()
}

impl Task for Ruler {
    fn name(&self) -> &'static str {
        self.config.task.name()
    }

    fn set(&mut self, key: &str, vals: &[&str]) -> Result<bool, String> {
        let c = &mut self.config;
        match key {
            "max_tokens" => self.max_tokens = positive(key, vals)?,
            "lengths" => {
                c.lengths = list(key, vals)?;
                if c.lengths.contains(&0) {
                    return Err("lengths must be ≥ 1".into());
                }
            }
            "depths" => {
                c.depths = list(key, vals)?;
                if let Some(d) = c.depths.iter().find(|d: &&f64| !(0.0..=1.0).contains(*d)) {
                    return Err(format!("depth {d} is outside [0, 1]"));
                }
            }
            "per_cell" => c.per_cell = positive(key, vals)?,
            "seed" => c.seed = number(key, vals)?,
            "haystack" => c.haystack = Haystack::parse(single(key, vals)?)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn check(&self) -> Result<(), String> {
        if self.config.task == RulerTask::CommonWords && self.config.haystack != Haystack::Noise {
            return Err("`cwe` has no haystack (its context is a list of words): `haystack=text` does not apply".into());
        }
        Ok(())
    }

    fn input(&self) -> Result<Option<PathBuf>> {
        self.config.haystack.file()
    }

    fn render(&self, short: bool) -> String {
        let (config, d) = (&self.config, RulerConfig::new(self.config.task));
        let mut opts = Vec::new();
        // (noise, the default, leaves the label as it always was)
        if config.haystack != d.haystack {
            opts.push(format!("haystack={}", config.haystack.render(short)));
        }
        if config.lengths != d.lengths {
            let v: Vec<String> = config.lengths.iter().map(|l| l.to_string()).collect();
            opts.push(format!("lengths={}", v.join(",")));
        }
        if config.depths != d.depths {
            let v: Vec<String> = config.depths.iter().map(|l| l.to_string()).collect();
            opts.push(format!("depths={}", v.join(",")));
        }
        if config.per_cell != d.per_cell {
            opts.push(format!("per_cell={}", config.per_cell));
        }
        if config.seed != d.seed {
            opts.push(format!("seed={}", config.seed));
        }
        if self.max_tokens != config.task.default_max_tokens() {
            opts.push(format!("max_tokens={}", self.max_tokens));
        }
        if opts.is_empty() {
            config.task.name().to_string()
        } else {
            format!("{}:{}", config.task.name(), opts.join(","))
        }
    }

    fn prepare(&self, model: &Model, tok: &Tokenizer, limit: Option<usize>) -> Result<Box<dyn Prepared>> {
        let (cfg, ctx) = (&self.config, model.config.context_len);
        if let Some(&l) = cfg.lengths.iter().find(|&&l| l >= ctx) {
            return Err(EvalError::Request(format!(
                "{} length {l} does not fit the model's context of {ctx} tokens",
                cfg.task.name()
            )));
        }
        let count = |s: &str| tok.encode(s).map_or(usize::MAX, |v| v.len());
        let mut items = Vec::new();
        for it in try_ruler_items(cfg, &count)?.into_iter().take(limit.unwrap_or(usize::MAX)) {
            let (ids, questions) = match it.questions.is_empty() {
                true => (tok.encode(&it.prompt)?, Vec::new()),
                false => split_questions(tok, &it.prompt, &it.questions)?,
            };
            items.push(Prompt { ids, answers: it.answers, len: it.target_len, depth: it.depth, questions });
        }
        Ok(Box::new(Prompts { items, max_tokens: self.max_tokens }))
    }
}

/// A context and the questions to ask after it, tokenized as the context
/// followed by each question would be: the context's ids are those every
/// `context + question` shares (a merge across the boundary moves the
/// boundary back), each question's the rest of its own.
fn split_questions(tok: &Tokenizer, context: &str, questions: &[String]) -> Result<(Vec<u32>, Vec<Vec<u32>>)> {
    let mut ctx = tok.encode(context)?;
    let whole: Vec<Vec<u32>> =
        questions.iter().map(|q| Ok(tok.encode(&format!("{context}{q}"))?)).collect::<Result<_>>()?;
    let shared =
        whole.iter().map(|w| w.iter().zip(&ctx).take_while(|(a, b)| a == b).count()).min().unwrap_or(ctx.len());
    ctx.truncate(shared);
    Ok((ctx, whole.into_iter().map(|w| w[shared..].to_vec()).collect()))
}

/// One item tokenized: for `niah_multiquery`, the questions' ids, asked one
/// at a time after the prompt, question i expecting answer i.
struct Prompt {
    ids: Vec<u32>,
    answers: Vec<String>,
    len: usize,
    depth: f64,
    questions: Vec<Vec<u32>>,
}

struct Prompts {
    items: Vec<Prompt>,
    max_tokens: usize,
}

impl Prepared for Prompts {
    fn items(&self) -> usize {
        self.items.len()
    }

    fn generation(&self) -> Option<GenerationItems<'_>> {
        Some((self.items.iter().map(|it| (&it.ids[..], &it.questions[..])).collect(), self.max_tokens, false))
    }

    fn run(&mut self, cell: &mut Cell<'_>) -> Result<KvPeak> {
        let gens = cell.generations(self.generation().expect("a generation task"))?;
        let tok = cell.tok;
        // per item: answers found, the largest KV bytes; with questions,
        // question i's generation is searched for answer i alone
        let found = gens
            .iter()
            .zip(self.items.iter())
            .map(|(g, it)| {
                let kv = g.iter().map(|g| g.kv_bytes).max_by_key(|b| b.kv).unwrap_or_default();
                let n = match it.questions.is_empty() {
                    true => answers_found(&tok.decode(&g[0].token_ids)?, &it.answers),
                    false => g
                        .iter()
                        .zip(&it.answers)
                        .map(|(g, a)| Ok(answers_found(&tok.decode(&g.token_ids)?, std::slice::from_ref(a))))
                        .sum::<Result<usize>>()?,
                };
                Ok((n, kv))
            })
            .collect::<Result<Vec<_>>>()?;
        // an item counts when every expected answer is in the output
        let mut peak = KvPeak::default();
        let mut by: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        let (mut recall, mut hits) = (0.0, Vec::with_capacity(self.items.len()));
        for ((n_found, b), it) in found.iter().zip(self.items.iter()) {
            peak.see(b.kv, b.metadata);
            let hit = *n_found == it.answers.len();
            recall += *n_found as f64 / it.answers.len().max(1) as f64;
            hits.push(f64::from(u8::from(hit)));
            for k in ["acc".to_string(), format!("acc_len{}", it.len), format!("acc_depth{}", it.depth)] {
                let e = by.entry(k).or_default();
                e.0 += usize::from(hit);
                e.1 += 1;
            }
        }
        let m = &mut cell.row.metrics;
        for (k, (h, n)) in by {
            m.insert(k, h as f64 / n.max(1) as f64);
        }
        m.insert("recall".into(), recall / self.items.len().max(1) as f64);
        let (n, acc) = (hits.len().max(1) as f64, m.get("acc").copied().unwrap_or(0.0));
        m.insert("acc_stderr".into(), (acc * (1.0 - acc) / (n - 1.0).max(1.0)).sqrt());
        cell.row.per_item.insert("acc".into(), hits);
        Ok(peak)
    }
}
