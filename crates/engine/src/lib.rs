//! The engine loop on top of a model and a KV cache: a [`session::Session`]
//! per sequence, token [`sampling`], text [`generate`]-ion, teacher-forced
//! [`perplexity`], and the [`bench`] harness.

pub mod beam;
pub mod bench;
pub mod calibrate;
pub mod context;
pub mod generate;
mod generation;
pub mod kvzap;
mod lockstep;
pub mod perplexity;
pub mod sampling;
pub mod session;
pub mod speculative;
pub mod synthetic;

pub use beam::{beam_search, BeamOptions, Hypothesis};

/// Runs `f` on a worker thread of rayon's global pool and returns its
/// result. A forward pass issues a few hundred parallel products per token;
/// from a thread outside the pool each one is injected into the pool and
/// waits for a sleeping worker to wake (tens of microseconds each, about
/// half a small model's decode step), while from a worker the same calls
/// start at once. Callers that drive the model in a loop (the CLI
/// commands, the server's scheduler, the Python bindings) run the loop
/// here.
pub fn on_workers<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    rayon::join(f, || ()).0
}
pub use context::Context;
pub use generate::{generate, generate_shared, prefill_shared, share_groups, GenerateOptions, Generation};
pub use perplexity::{perplexity, FullComparison, PerplexityOptions, PerplexityReport, Summary};
pub use sampling::{Sampler, SamplingParams};
pub use session::{Feed, Session, WHOLE_CHUNKS};
pub use speculative::{
    replay_drafts, speculative_run, CopyThenModel, DraftLength, Drafter, ModelDrafter, NgramDrafter, SpecStats,
    Speculator, Verification,
};

/// Errors of the engine: model errors plus request validation.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] kvslim_models::Error),
    #[error("{0}")]
    Request(String),
    /// A request refused because of one setting; shown with the engine's
    /// name for it ([`Setting::field`]), while front ends write their own.
    #[error("{}", .0.message(.0.setting.field()))]
    Setting(SettingError),
}

/// An option of the engine's API that errors can blame. The engine names
/// it as its options structs do; the CLI writes it as a flag, Python as a
/// keyword, so each user reads the name they typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    Prefill,
    CompareFull,
    DecisionsFrom,
    MaxTokens,
    Temperature,
    MaxKl,
}

impl Setting {
    /// The field that holds it (`PerplexityOptions::prefill`, …).
    pub fn field(self) -> &'static str {
        match self {
            Setting::Prefill => "prefill",
            Setting::CompareFull => "compare_full",
            Setting::DecisionsFrom => "decisions_from",
            Setting::MaxTokens => "max_tokens",
            Setting::Temperature => "temperature",
            Setting::MaxKl => "max_kl",
        }
    }
}

/// The message of a [`EngineError::Setting`]: text around the setting's
/// name, so a front end can put in its own name for it.
#[derive(Debug)]
pub struct SettingError {
    pub setting: Setting,
    before: String,
    after: String,
}

impl EngineError {
    /// The error `before` + the setting's name + `after`.
    pub(crate) fn setting(setting: Setting, before: impl Into<String>, after: impl Into<String>) -> Self {
        EngineError::Setting(SettingError { setting, before: before.into(), after: after.into() })
    }
}

impl SettingError {
    /// The message with `name` written for the setting.
    pub fn message(&self, name: &str) -> String {
        format!("{}{name}{}", self.before, self.after)
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
