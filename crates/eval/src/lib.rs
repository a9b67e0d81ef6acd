//! Building blocks of the evaluation harness:
//!
//! * [`tasks`]: the task kinds, each one file with its loader, items and
//!   cell scoring (multiple-choice jsonl, HellaSwag's 6-line format,
//!   perplexity text, generation prompts, code completion, RULER-style
//!   long-context tasks), listed in [`tasks::KINDS`], plus the task-spec
//!   parser ([`tasks::TaskSpec`]);
//! * [`score`]: log-likelihood of continuations under a cache policy
//!   ([`score::score_choices`]) and accuracy / length-normalised accuracy;
//! * [`metrics`]: KL(full‖policy), top-1 agreement, generation divergence,
//!   passkey hits;
//! * [`budget`]: one budget (`20%`, `64`) turned into each policy family's
//!   spec at equal slots ([`budget::BudgetedPolicy`]);
//! * [`results`]: one JSON line per finished cell in `results.jsonl`,
//!   resume, and `results.csv` / `results.md`;
//! * [`cell`]: one cell in flight (a task under one policy at one budget)
//!   and how its items run: parallel blocks, shared prefills;
//! * [`matrix`]: [`matrix::run_matrix`], the models × policies × budgets ×
//!   tasks loop with a progress callback, which only runs the cells;
//! * [`plots`]: quality-vs-budget charts (PNG + SVG) from result rows, drawn
//!   by [`chart`] (line charts with `plotters`);
//! * [`shard`]: one matrix split over processes (`--shard I/N`) and the
//!   merge of their outputs into the unsharded run's files;
//! * [`tune`]: `kvslim tune`, the search for the best policy at a budget
//!   (or the smallest budget meeting a KL target) on calibration text.

/// `FromStr` for an enum from its command-line names:
/// `parse_names! { Type, "what": "name" => value, ... }`; an unknown name is
/// an error listing the known ones.
macro_rules! parse_names {
    ($t:ty, $what:literal: $($name:literal => $value:expr),+ $(,)?) => {
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                match s {
                    $($name => Ok($value),)+
                    o => Err(format!("unknown {} `{o}` ({})", $what, [$($name),+].join(", "))),
                }
            }
        }
    };
}

pub mod budget;
pub mod cell;
pub mod chart;
pub mod forked;
pub mod matrix;
pub mod metrics;
pub mod paired;
pub mod plots;
pub mod results;
pub mod score;
pub mod shard;
pub mod speed;
pub mod tasks;
pub mod tune;

pub use budget::{BudgetedPolicy, PolicySource};
pub use matrix::{run_matrix, MatrixConfig, MatrixEvent};
pub use results::{CellKey, ResultRow, ResultsLog};
pub use score::{score_choices, Choice, ChoiceScore, McTally, ScoreMode, Scoring};
pub use shard::{merge_shards, MergeOptions, Merged, Shard, ShardManifest};
pub use tasks::TaskSpec;

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
    /// The window length a policy is tuned at ([`tune::TuneConfig::seq_len`]).
    SeqLen,
    /// Where tune windows start ([`tune::tune_windows`]'s `skip`).
    SkipTokens,
    /// [`MatrixConfig::out_dir`].
    OutDir,
    /// [`MergeOptions::replace`].
    Replace,
    /// [`MatrixConfig::resume`].
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
