//! `--draft-model`, `--draft-policy`: speculative decoding with drafts from
//! a second, smaller model that shares the target's vocabulary.

use crate::common::CliResult;
use kvslim_cache::PolicySpec;
use kvslim_engine::{CopyThenModel, Drafter, ModelDrafter, NgramDrafter};
use kvslim_models::{Model, Tokenizer};

#[derive(clap::Args)]
pub struct DraftArgs {
    /// Speculative decoding with drafts from this model (a path or alias,
    /// as for --model; e.g. `qwen2.5-coder-0.5b` for
    /// `qwen2.5-coder-1.5b`): greedy only, and the output is plain greedy
    /// decoding's. It must share the target's vocabulary id for id. Whether
    /// it pays depends on how often its tokens are the target's and on how
    /// cheap its steps are: docs/results/speed.md#a-draft-model measures it.
    #[arg(long, value_name = "MODEL")]
    pub draft_model: Option<String>,
    /// The draft model's KV cache policy (default: the target's).
    #[arg(long, value_name = "POLICY", requires = "draft_model", value_parser = PolicySpec::parse_and_load)]
    pub draft_policy: Option<PolicySpec>,
}

/// A loaded draft model, and the policy it drafts under if not the target's.
pub struct DraftModel {
    pub model: Model,
    pub policy: Option<PolicySpec>,
}

impl DraftArgs {
    /// Loads the draft model, if one is named (with the target's choice of
    /// products), refusing one whose vocabulary is not the target's.
    pub fn load(&self, target: &Tokenizer, f32_activations: bool) -> CliResult<Option<DraftModel>> {
        let Some(name) = &self.draft_model else { return Ok(None) };
        let mut loaded = kvslim_models::load_model(&kvslim_hub::resolve_model(name)?)?;
        if f32_activations {
            loaded.model.weights.set_products(kvslim_kernels::Products::F32);
        }
        let tok = loaded.tokenizer.as_ref().ok_or_else(|| {
            format!("draft model {name} carries no tokenizer, so its vocabulary cannot be checked against the target's")
        })?;
        if let Some(diff) = tok.vocabulary_mismatch(target) {
            return Err(format!(
                "draft model {name} does not share the target's vocabulary ({diff}): a draft model needs the target's \
                 tokenizer"
            )
            .into());
        }
        Ok(Some(DraftModel { model: loaded.model, policy: self.draft_policy.clone() }))
    }
}

/// How `--speculative` drafts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DraftKind {
    /// Prompt lookup: copies from the context (free; pays on edits).
    Ngram,
    /// The target drafting for itself (a test of the machinery).
    #[value(name = "self")]
    SelfDraft,
    /// The --draft-model.
    Model,
    /// Copies where the context offers a match, else the --draft-model.
    #[value(name = "ngram+model")]
    NgramModel,
}

impl DraftKind {
    /// The kind in force: the one asked for, else with a draft model the
    /// copier in front of it; checked against whether a draft model is given.
    pub fn resolve(asked: Option<DraftKind>, draft: Option<&DraftModel>) -> CliResult<Option<DraftKind>> {
        match (asked, draft.is_some()) {
            (None, true) => Ok(Some(DraftKind::NgramModel)),
            (Some(DraftKind::Model | DraftKind::NgramModel), false) => {
                Err("--speculative model and ngram+model draft with --draft-model: name one".into())
            }
            (Some(k @ (DraftKind::Ngram | DraftKind::SelfDraft)), true) => {
                Err(format!("--draft-model drafts with --speculative model or ngram+model, not {}", k.name()).into())
            }
            (asked, _) => Ok(asked),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DraftKind::Ngram => "ngram",
            DraftKind::SelfDraft => "self",
            DraftKind::Model => "model",
            DraftKind::NgramModel => "ngram+model",
        }
    }

    /// The drafter for one generation of at most `max_len` tokens.
    pub fn drafter<'m>(
        self,
        target: &'m Model,
        draft: Option<&'m DraftModel>,
        policy: &PolicySpec,
        max_len: usize,
    ) -> Box<dyn Drafter + 'm> {
        let model =
            |d: &'m DraftModel| ModelDrafter::new(&d.model, d.policy.clone().unwrap_or(policy.clone()), max_len);
        match (self, draft) {
            (DraftKind::SelfDraft, _) => Box::new(ModelDrafter::new(target, policy.clone(), max_len)),
            (DraftKind::Model, Some(d)) => Box::new(model(d)),
            (DraftKind::NgramModel, Some(d)) => Box::new(CopyThenModel::new(model(d))),
            _ => Box::new(NgramDrafter::default()),
        }
    }
}
