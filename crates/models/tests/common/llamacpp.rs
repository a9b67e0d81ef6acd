//! llama.cpp's view of a real GGUF model (`../shared/fixtures/*/
//! reference_wikitext2.json`, made by `tools/make_llamacpp_reference.py`):
//! its tokenization, teacher-forced log-probs, top-5 logits per position
//! and a 24-token greedy continuation, and the checks our forward pass must
//! pass against it.

use kvslim_cache::PolicySpec;
use kvslim_models::{load_model, LoadedModel, Logits, Model, Scratch};
use serde_json::Value;
use std::sync::OnceLock;

/// The model behind a built-in alias (user caches, else fetched), loaded;
/// the panic says how to fetch it.
pub fn load_alias(alias: &str) -> LoadedModel {
    let path =
        kvslim_hub::resolve_model(alias).unwrap_or_else(|e| panic!("{alias} is needed (`kvslim fetch {alias}`): {e}"));
    load_model(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// A real model (behind its alias) and llama.cpp's reference for it, each
/// loaded once, with the checks every real-model test runs.
pub struct RealModel {
    alias: &'static str,
    fixture: &'static str,
    model: OnceLock<LoadedModel>,
    reference: OnceLock<LlamaCppRef>,
    teacher_forced: OnceLock<Vec<f32>>,
}

/// A real model's three tests against its llama.cpp fixture, each with the
/// doc comment written before its keyword: `tokenization`
/// (`tokenization_equals_llama_cpp`), `teacher_forced`
/// (`teacher_forced_log_probs_match_llama_cpp`) and `greedy`
/// (`greedy_continuation_matches_llama_cpp`), of the [`RealModel`] static
/// named first.
#[macro_export]
macro_rules! llama_cpp_tests {
    ($model:ident; $(#[$tok:meta])* tokenization; $(#[$nll:meta])* teacher_forced; $(#[$greedy:meta])* greedy;) => {
        $(#[$tok])*
        #[test]
        fn tokenization_equals_llama_cpp() {
            $model.check_tokenization();
        }

        $(#[$nll])*
        #[test]
        fn teacher_forced_log_probs_match_llama_cpp() {
            $model.check_teacher_forced();
        }

        $(#[$greedy])*
        #[test]
        fn greedy_continuation_matches_llama_cpp() {
            $model.check_greedy();
        }
    };
}

impl RealModel {
    pub const fn new(alias: &'static str, fixture: &'static str) -> Self {
        RealModel {
            alias,
            fixture,
            model: OnceLock::new(),
            reference: OnceLock::new(),
            teacher_forced: OnceLock::new(),
        }
    }

    pub fn model(&self) -> &LoadedModel {
        self.model.get_or_init(|| load_alias(self.alias))
    }

    pub fn reference(&self) -> &LlamaCppRef {
        self.reference.get_or_init(|| LlamaCppRef::load(self.fixture))
    }

    /// Teacher-forced logits of the reference tokens, prefilled as one chunk.
    pub fn teacher_forced(&self) -> &[f32] {
        self.teacher_forced.get_or_init(|| self.reference().teacher_forced(&self.model().model))
    }

    /// Our tokenizer gives llama.cpp's ids for the start of WikiText-2
    /// (encoded from a prefix long enough that the cut cannot move a token
    /// boundary inside the reference's; CRLF read as LF, as the fixture's
    /// script read the file).
    pub fn check_tokenization(&self) {
        let raw = std::fs::read_to_string(super::shared().join("data/wikitext2/wiki.test.raw")).unwrap();
        let text = raw[..12_000].replace("\r\n", "\n");
        let tok = self.model().tokenizer.as_ref().expect("the GGUF carries its tokenizer");
        let want = &self.reference().token_ids;
        let got = tok.encode(&text).unwrap();
        assert!(got.len() > want.len() + 64, "the prefix holds only {} tokens", got.len());
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            panic!("token {i} differs: ours {:?} llama.cpp {:?}", &got[i..(i + 8)], &want[i..(i + 8).min(want.len())]);
        }
    }

    /// Mean NLL within 1% of llama.cpp's; top-1 agreement at least 90%.
    pub fn check_teacher_forced(&self) {
        let r = self.reference();
        let (nll, top1) = r.compare(self.alias, self.teacher_forced(), self.model().model.config.vocab_size);
        assert!((nll - r.nll).abs() <= 0.01 * r.nll, "NLL {nll} not within 1% of llama.cpp's {}", r.nll);
        assert!(top1 >= 0.9, "top-1 agreement {top1}");
    }

    /// [`LlamaCppRef::check_greedy`] with our measured logit distance from
    /// llama.cpp as the near-tie gap.
    pub fn check_greedy(&self) -> usize {
        let m = &self.model().model;
        let gap = self.reference().top1_logit_gap(self.teacher_forced(), m.config.vocab_size);
        self.reference().check_greedy(self.alias, m, gap)
    }
}

pub struct LlamaCppRef {
    /// llama.cpp's tokenization of the start of the text (BOS first when the
    /// model adds one).
    pub token_ids: Vec<u32>,
    /// `logprobs[i] = ln p(ids[i+1] | ids[..=i])`.
    pub logprobs: Vec<f64>,
    pub nll: f64,
    pub top5_ids: Vec<Vec<u32>>,
    pub top5_logits: Vec<Vec<f32>>,
    pub greedy_prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

impl LlamaCppRef {
    pub fn load(fixture: &str) -> Self {
        let p = super::shared().join(fixture);
        let r: Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
                .unwrap();
        let rows = |k: &str| r[k].as_array().unwrap().clone();
        LlamaCppRef {
            token_ids: u32s(&r["token_ids"]),
            logprobs: rows("logprobs").iter().map(|x| x.as_f64().unwrap()).collect(),
            nll: r["nll"].as_f64().unwrap(),
            top5_ids: rows("top5_ids").iter().map(u32s).collect(),
            top5_logits: rows("top5_logits")
                .iter()
                .map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
                .collect(),
            greedy_prompt_ids: u32s(&r["greedy_prompt_ids"]),
            greedy_ids: u32s(&r["greedy_ids"]),
        }
    }

    /// Our logits for every reference token, prefilled as one chunk under
    /// the full cache.
    pub fn teacher_forced(&self, m: &Model) -> Vec<f32> {
        let n = self.token_ids.len();
        let mut cache = m.new_cache(&PolicySpec::parse("full").unwrap(), n, n).unwrap();
        let mut s = Scratch::new();
        m.forward(&self.token_ids, &mut cache, &mut s, Logits::All).unwrap();
        s.logits().to_vec()
    }

    /// Compares teacher-forced `logits` with llama.cpp's: returns our mean
    /// NLL and the share of positions whose top-1 token agrees, and prints
    /// both with the log-prob differences and the top-5 overlap.
    pub fn compare(&self, name: &str, logits: &[f32], vocab: usize) -> (f64, f64) {
        let ids = &self.token_ids;
        let got: Vec<f64> = (0..ids.len() - 1)
            .map(|i| log_softmax_at(&logits[i * vocab..(i + 1) * vocab], ids[i + 1] as usize))
            .collect();
        let nll = -got.iter().sum::<f64>() / got.len() as f64;
        let diffs: Vec<f64> = got.iter().zip(&self.logprobs).map(|(a, b)| (a - b).abs()).collect();
        let max_diff = diffs.iter().fold(0f64, |m, &d| m.max(d));
        let mean_diff = diffs.iter().sum::<f64>() / diffs.len() as f64;
        let (mut top1, mut top5_overlap) = (0, 0);
        for (i, theirs) in self.top5_ids.iter().enumerate() {
            let ours = top_k(&logits[i * vocab..(i + 1) * vocab], 5);
            top1 += usize::from(ours[0] == theirs[0]);
            top5_overlap += ours.iter().filter(|x| theirs.contains(x)).count();
        }
        let n = ids.len() as f64;
        eprintln!(
            "{name}: NLL {nll:.4} vs llama.cpp {:.4} ({:+.2}%), |Δ logprob| mean {mean_diff:.4} max {max_diff:.3}, top-1 agreement {:.3}, top-5 overlap {:.3}",
            self.nll,
            100.0 * (nll - self.nll) / self.nll,
            top1 as f64 / n,
            top5_overlap as f64 / (5.0 * n)
        );
        (nll, top1 as f64 / n)
    }

    /// The 90th percentile of |Δ| between our logit and llama.cpp's for
    /// llama.cpp's top-1 token: how far our arithmetic typically sits from
    /// llama.cpp's 8-bit activations on this model.
    pub fn top1_logit_gap(&self, logits: &[f32], vocab: usize) -> f32 {
        let mut gaps: Vec<f32> = (0..self.top5_ids.len())
            .map(|i| (logits[i * vocab + self.top5_ids[i][0] as usize] - self.top5_logits[i][0]).abs())
            .collect();
        gaps.sort_by(f32::total_cmp);
        gaps[gaps.len() * 9 / 10]
    }

    /// Greedy decoding from the reference prompt equals llama.cpp's
    /// continuation, or its first divergence is a near-tie: our margin
    /// between the two candidates is below twice `gap` (see
    /// [`LlamaCppRef::top1_logit_gap`]): a margin is the difference of two
    /// logits, each off by up to `gap`, so the two engines can order them
    /// differently within that sum. Returns how many tokens agreed.
    pub fn check_greedy(&self, name: &str, m: &Model, gap: f32) -> usize {
        let n = self.greedy_prompt_ids.len() + self.greedy_ids.len();
        let mut cache = m.new_cache(&PolicySpec::parse("full").unwrap(), n, n).unwrap();
        let mut s = Scratch::new();
        m.forward(&self.greedy_prompt_ids, &mut cache, &mut s, Logits::Last).unwrap();
        for (step, &w) in self.greedy_ids.iter().enumerate() {
            let top = top_k(s.logits(), 2);
            if top[0] != w {
                let margin = s.logits()[top[0] as usize] - s.logits()[w as usize];
                eprintln!(
                    "{name} greedy: {step} tokens identical, then a near-tie: margin {margin:.4} to llama.cpp's token, 90% of our top-1 logits sit within {gap:.3} of llama.cpp's"
                );
                assert!(
                    margin < 2.0 * gap,
                    "step {step}: we pick {} over llama.cpp's {w} by {margin} (each logit within {gap} of llama.cpp's)",
                    top[0]
                );
                return step;
            }
            m.forward(&[w], &mut cache, &mut s, Logits::Last).unwrap();
        }
        eprintln!("{name} greedy: all {} tokens identical", self.greedy_ids.len());
        self.greedy_ids.len()
    }
}

pub fn log_softmax_at(row: &[f32], id: usize) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row[id] as f64 - max - sum.ln()
}

pub fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.select_nth_unstable_by(k, |&a, &b| row[b].total_cmp(&row[a]));
    idx.truncate(k);
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    idx.into_iter().map(|i| i as u32).collect()
}
