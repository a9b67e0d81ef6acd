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
pub mod error;
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
pub use error::{EvalError, Result, Setting, SettingError};
pub use matrix::{run_matrix, MatrixConfig, MatrixEvent};
pub use results::{CellKey, ResultRow, ResultsLog};
pub use score::{score_choices, Choice, ChoiceScore, McTally, ScoreMode, Scoring};
pub use shard::{merge_shards, MergeOptions, Merged, Shard, ShardManifest};
pub use tasks::TaskSpec;
