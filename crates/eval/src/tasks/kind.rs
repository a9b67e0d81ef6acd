//! What one kind of task implements: its spec ([`Task`]: options, label,
//! data file), its items tokenized once for all its cells, and one cell run
//! and scored ([`Prepared`]). [`super::KINDS`] lists every kind.

use crate::budget::BudgetedPolicy;
use crate::cell::Cell;
pub use crate::cell::GenerationItems;
use crate::error::Result;
use kvslim_models::{Model, Tokenizer};
use std::any::Any;
use std::fmt;
use std::path::{Path, PathBuf};

/// How specs name a task kind: one entry of [`super::KINDS`].
pub struct Kind {
    /// The names a spec starts with (`ppl`, or each RULER task's).
    pub names: &'static [&'static str],
    /// Whether a data file follows the name (`KIND:FILE`).
    pub file: bool,
    /// A bare `FILE` spec ending in one of these is of this kind.
    pub extensions: &'static [&'static str],
    /// Its options, `limit` last, for the unknown-option error.
    pub options: &'static str,
    /// Metrics that `results.md` tabulates and charts, in this order.
    pub headline: &'static [&'static str],
    /// The task named `name` on `path` (empty without a file), every
    /// option at its default.
    pub new: fn(name: &str, path: PathBuf) -> Box<dyn Task>,
}

/// A task's settings, parsed from its spec (`limit` aside, which
/// [`super::TaskSpec`] keeps). `Debug` is part of the run's fingerprint
/// ([`crate::MatrixConfig::fingerprint`]): a kind's struct and field names
/// stay as they are.
pub trait Task: fmt::Debug + Send + Sync + DynTask {
    /// The kind's name (`ppl`, `mc`, …, or the RULER task).
    fn name(&self) -> &'static str;
    /// Sets option `key`; `Ok(false)` when the kind has no such option.
    fn set(&mut self, key: &str, vals: &[&str]) -> Result<bool, String>;
    /// Checks the options together once all are set.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
    /// A run-wide window length (`kvslim eval --seq-len`) for a spec
    /// without `seq_len=`; kinds without windows ignore it.
    fn default_seq_len(&mut self, _seq_len: usize) -> Result<(), String> {
        Ok(())
    }
    /// The data file, if the task has one.
    fn path(&self) -> Option<&Path> {
        None
    }
    /// The file a run must be able to open before it starts.
    fn input(&self) -> Result<Option<PathBuf>> {
        Ok(self.path().map(Path::to_path_buf))
    }
    /// The spec without `limit`, options at their defaults left out;
    /// `short`: file names only (the result files' task column).
    fn render(&self, short: bool) -> String;
    /// The K/V dtype a cell of `policy` follows the decisions of (ppl's
    /// [`crate::MatrixConfig::decisions_from`]); part of the cell's key.
    fn decisions_from(
        &self,
        _policy: &BudgetedPolicy,
        _from: Option<kvslim_cache::KvDtype>,
    ) -> Result<Option<kvslim_cache::KvDtype>> {
        Ok(None)
    }
    /// Reads and tokenizes the items once for all the task's cells; at
    /// most `limit` of them.
    fn prepare(&self, model: &Model, tok: &Tokenizer, limit: Option<usize>) -> Result<Box<dyn Prepared>>;
}

/// A task's items, tokenized, and how a cell runs and scores them.
pub trait Prepared: Send + Sync {
    /// How many items a cell runs.
    fn items(&self) -> usize;
    /// A generation task's prompts, so that the cells of a task can share
    /// their prefills ([`crate::MatrixConfig::shared_prefill`]).
    fn generation(&self) -> Option<GenerationItems<'_>> {
        None
    }
    /// Whether a cell keeps its finished blocks in `partial.jsonl` and a
    /// resumed run continues it midway ([`crate::results::PartialCell`]).
    fn journaled(&self) -> bool {
        false
    }
    /// Runs every item under the cell's policy and puts the metrics (and
    /// per-item values for paired intervals) into `cell.row`; returns the
    /// largest K/V bytes an item held.
    fn run(&mut self, cell: &mut Cell<'_>) -> Result<KvPeak>;
}

/// The most K/V and metadata bytes one item's cache held.
#[derive(Clone, Copy, Debug, Default)]
pub struct KvPeak {
    pub kv: usize,
    pub metadata: usize,
}

impl KvPeak {
    pub fn see(&mut self, kv: usize, metadata: usize) {
        self.kv = self.kv.max(kv);
        self.metadata = self.metadata.max(metadata);
    }
}

/// Clone, equality and downcasts for every [`Task`], so a kind needs only
/// `#[derive(Clone, Debug, PartialEq)]`.
pub trait DynTask: Any {
    fn clone_box(&self) -> Box<dyn Task>;
    fn eq_dyn(&self, other: &dyn Task) -> bool;
    fn as_any(&self) -> &dyn Any;
}

impl<T: Task + Clone + PartialEq> DynTask for T {
    fn clone_box(&self) -> Box<dyn Task> {
        Box::new(self.clone())
    }
    fn eq_dyn(&self, other: &dyn Task) -> bool {
        other.as_any().downcast_ref::<T>() == Some(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl dyn Task {
    /// The task as its kind's struct, if it is of that kind.
    pub fn downcast<T: Task>(&self) -> Option<&T> {
        self.as_any().downcast_ref()
    }
}

impl Clone for Box<dyn Task> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

/// `path` as a spec shows it: the file name only when `short`.
pub fn file_label(path: &Path, short: bool) -> String {
    match path.file_name() {
        Some(f) if short => f.to_string_lossy().into_owned(),
        _ => path.display().to_string(),
    }
}

/// `NAME:FILE` (the file name only when `short`), then `,KEY=VALUE` for
/// each option given (`None`: at its default, left out).
pub fn file_spec(name: &str, path: &Path, short: bool, opts: &[Option<String>]) -> String {
    let mut s = format!("{name}:{}", file_label(path, short));
    for o in opts.iter().flatten() {
        s += ",";
        s += o;
    }
    s
}

/// `KEY=VALUE` for [`file_spec`] unless `value` is the default.
pub fn unless_default<T: PartialEq + fmt::Display>(key: &str, value: T, default: T) -> Option<String> {
    (value != default).then(|| format!("{key}={value}"))
}

/// Sets `slot` from option `key` when it is the kind's option `name`
/// ([`Task::set`]'s answer: whether it was).
pub fn set_option<T>(
    slot: &mut T,
    key: &str,
    name: &str,
    vals: &[&str],
    parse: impl FnOnce(&str, &[&str]) -> Result<T, String>,
) -> Result<bool, String> {
    if key != name {
        return Ok(false);
    }
    *slot = parse(key, vals)?;
    Ok(true)
}

/// The one value of option `key`.
pub fn single<'a>(key: &str, vals: &[&'a str]) -> Result<&'a str, String> {
    match vals {
        [v] => Ok(v),
        _ => Err(format!("`{key}` takes one value, got {}", vals.len())),
    }
}

/// Option `key`'s one value as a number.
pub fn number<T: std::str::FromStr>(key: &str, vals: &[&str]) -> Result<T, String> {
    let v = single(key, vals)?;
    v.parse().map_err(|_| format!("`{key}={v}` is not a valid number"))
}

/// Option `key` as a number of at least 1.
pub fn positive(key: &str, vals: &[&str]) -> Result<usize, String> {
    match number(key, vals)? {
        0 => Err(format!("{key} must be ≥ 1")),
        n => Ok(n),
    }
}
