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
pub use generate::{continue_generation, generate, generate_shared, prefill_shared, GenerateOptions, Generation};
pub use perplexity::{perplexity, FullComparison, PerplexityOptions, PerplexityReport, Summary};
pub use sampling::{Sampler, SamplingParams};
pub use session::Session;
pub use speculative::{
    speculative_generate, speculative_run, DraftLength, Drafter, ModelDrafter, NgramDrafter, SpecStats, Verification,
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
