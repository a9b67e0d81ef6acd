//! The engine loop on top of a model and a KV cache: a [`session::Session`]
//! per sequence, token [`sampling`], text [`generate`]-ion, teacher-forced
//! [`perplexity`], and the [`bench`] harness.

pub mod beam;
pub mod bench;
pub mod calibrate;
pub mod generate;
pub mod perplexity;
pub mod sampling;
pub mod session;
pub mod speculative;
pub mod synthetic;

pub use beam::{beam_search, BeamOptions, Hypothesis};
pub use generate::{generate, GenerateOptions, Generation};
pub use perplexity::{perplexity, FullComparison, PerplexityOptions, PerplexityReport, Summary};
pub use sampling::{Sampler, SamplingParams};
pub use session::Session;
pub use speculative::{
    speculative_generate, speculative_run, Drafter, ModelDrafter, NgramDrafter, SpecStats, Verification,
};

/// Errors of the engine: model errors plus request validation.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] kvslim_models::Error),
    #[error("{0}")]
    Request(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
