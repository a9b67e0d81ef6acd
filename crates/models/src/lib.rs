//! Models: what a checkpoint is ([`config::ModelConfig`], [`weights::Weights`]),
//! how it is read ([`loader`]), how text becomes tokens ([`tokenizer`]) and
//! how tokens become logits ([`transformer`]).

pub mod chat;
pub mod config;
pub mod kvzap;
pub mod loader;
pub mod tokenizer;
pub mod transformer;
pub mod weights;

pub use config::{Architecture, ModelConfig};
pub use loader::{load_model, LoadedModel};
pub use tokenizer::Tokenizer;
pub use transformer::{Logits, Model, Scratch, Trace};

use std::path::PathBuf;

/// Everything that can go wrong reading a model or running it. Variants
/// name the file and the problem; none of them is a panic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Format { path: PathBuf, reason: String },
    /// A model whose config and weights (from any file or built in code)
    /// cannot run: they disagree, or a dimension is out of the kernels' range.
    #[error("invalid model: {0}")]
    InvalidModel(String),
    #[error("unknown architecture `{name}`; supported: {list}", name = .0, list = loader::supported_architectures())]
    UnknownArchitecture(String),
    #[error("{path}: tensor `{name}` has unsupported type {dtype}")]
    UnsupportedTensorType { path: PathBuf, name: String, dtype: String },
    #[error("tensor `{name}`: expected shape {expected:?}, found {got:?}")]
    ShapeMismatch { name: String, expected: Vec<usize>, got: Vec<usize> },
    #[error("tensor `{0}` is missing from the checkpoint")]
    MissingTensor(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("{0}")]
    Kernel(#[from] kvslim_kernels::KernelError),
    #[error(transparent)]
    Cache(#[from] kvslim_cache::CacheError),
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("position {pos} is beyond the model's context length {context}")]
    ContextOverflow { pos: usize, context: usize },
    /// A call given input it does not handle (e.g. a batched run of a
    /// sequence whose CHAI probe is still open).
    #[error("{0}")]
    Unsupported(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn format(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Format { path: path.into(), reason: reason.into() }
    }
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}
