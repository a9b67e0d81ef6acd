//! The evaluation harness's errors, and the settings an error can blame.

use std::path::PathBuf;

/// Everything that can go wrong in evaluation. Input errors name the file
/// and, for line-based formats, the 1-based line.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: {reason}", path.display())]
    Parse { path: PathBuf, line: usize, reason: String },
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    #[error("task spec `{spec}`: {reason}")]
    TaskSpec { spec: String, reason: String },
    #[error("budget `{budget}` for `{family}`: {reason}")]
    Budget { family: String, budget: String, reason: String },
    #[error(transparent)]
    Policy(#[from] kvslim_cache::PolicySpecError),
    #[error(transparent)]
    Engine(#[from] kvslim_engine::EngineError),
    #[error(transparent)]
    Model(#[from] kvslim_models::Error),
    #[error("{0}")]
    Request(String),
    /// Refused because of one setting, written with the library's name for
    /// it ([`Setting::field`]); front ends write their own.
    #[error("{}", .0.message(.0.setting.field(), "="))]
    Setting(SettingError),
}

/// A setting of the evaluation API that an error can blame, so that each
/// user reads the name they set it by (the CLI writes its flag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// The window length a policy is tuned at ([`crate::tune::TuneConfig::seq_len`]).
    SeqLen,
    /// Where tune windows start ([`crate::tune::tune_windows`]'s `skip`).
    SkipTokens,
    /// [`crate::MatrixConfig::out_dir`].
    OutDir,
    /// [`crate::MergeOptions::replace`].
    Replace,
    /// [`crate::MatrixConfig::resume`].
    Resume,
}

impl Setting {
    /// The field or argument that holds it.
    pub fn field(self) -> &'static str {
        match self {
            Setting::SeqLen => "seq_len",
            Setting::SkipTokens => "skip",
            Setting::OutDir => "out_dir",
            Setting::Replace => "replace",
            Setting::Resume => "resume",
        }
    }
}

/// The message of an [`EvalError::Setting`]: text around the setting's
/// name and the value it should take, if any.
#[derive(Debug)]
pub struct SettingError {
    pub setting: Setting,
    pub value: Option<u64>,
    before: String,
    after: String,
}

impl SettingError {
    /// The message with `name` written for the setting, and `sep` between
    /// it and its value (`--skip-tokens 51`, `skip=51`).
    pub fn message(&self, name: &str, sep: &str) -> String {
        let value = self.value.map_or(String::new(), |v| format!("{sep}{v}"));
        format!("{}{name}{value}{}", self.before, self.after)
    }
}

impl EvalError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        EvalError::Io { path: path.into(), source }
    }
    pub(crate) fn parse(path: impl Into<PathBuf>, line: usize, reason: impl Into<String>) -> Self {
        EvalError::Parse { path: path.into(), line, reason: reason.into() }
    }
    /// The error `before` + the setting (with `value`) + `after`.
    pub(crate) fn setting(setting: Setting, value: Option<u64>, before: String, after: &str) -> Self {
        EvalError::Setting(SettingError { setting, value, before, after: after.into() })
    }
}

pub type Result<T, E = EvalError> = std::result::Result<T, E>;
