//! Journals of work in flight: a multiple-choice cell's finished blocks
//! (`partial.jsonl`) and a shared-prefill group's (`partial-shared.jsonl`).

use super::CellKey;
use crate::error::{EvalError, Result};
use crate::score::ChoiceScore;
use kvslim_engine::Generation;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// An append-only JSON-lines file whose lines reach the file system as
/// they are written: the results log and the partial files of cells and
/// groups in flight.
pub(super) struct Journal {
    pub(super) path: PathBuf,
    pub(super) file: File,
}

impl Journal {
    /// Opens the partial file `path` for appending; with `resume`, keeps
    /// its leading lines that parse as `B` while `take` accepts them (each
    /// continuing the ones before), drops the rest (a truncated or foreign
    /// line and whatever follows) and rewrites the file with those kept.
    fn resume_blocks<B: DeserializeOwned>(
        path: PathBuf,
        resume: bool,
        mut take: impl FnMut(B) -> bool,
    ) -> Result<Self> {
        let mut kept = String::new();
        if resume {
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(EvalError::io(&path, e)),
            };
            for line in text.lines() {
                if !serde_json::from_str::<B>(line).is_ok_and(&mut take) {
                    break;
                }
                kept.push_str(line);
                kept.push('\n');
            }
        }
        std::fs::write(&path, &kept).map_err(|e| EvalError::io(&path, e))?;
        let file = OpenOptions::new().append(true).open(&path).map_err(|e| EvalError::io(&path, e))?;
        Ok(Journal { path, file })
    }

    /// Appends `value` (a `what`) as a JSON line and flushes it to the file
    /// system.
    pub(super) fn append(&mut self, value: &impl Serialize, what: &str) -> Result<()> {
        let mut line = serde_json::to_string(value).map_err(|e| EvalError::Request(format!("{what}: {e}")))?;
        line.push('\n');
        let io = |e| EvalError::io(&self.path, e);
        self.file.write_all(line.as_bytes()).map_err(io)?;
        self.file.flush().map_err(io)?;
        self.file.sync_data().map_err(io)
    }

    /// The work it kept is done: removes the file.
    fn finish(self) -> Result<()> {
        drop(self.file);
        std::fs::remove_file(&self.path).map_err(|e| EvalError::io(&self.path, e))
    }
}

/// One block of a multiple-choice cell's scored items, as a line of
/// `partial.jsonl`.
#[derive(Serialize, Deserialize)]
struct PartialBlock {
    key: CellKey,
    /// Items in the cell, so a changed task file is not resumed.
    items: usize,
    /// Index of the block's first item.
    start: usize,
    scores: Vec<Vec<ChoiceScore>>,
    /// Seconds the block took, so the finished cell's `wall` counts every run.
    seconds: f64,
}

/// What an interrupted run of a cell left: its items' scores, in order,
/// and the seconds spent on them.
#[derive(Debug, Default, PartialEq)]
pub struct Resumed {
    pub scores: Vec<Vec<ChoiceScore>>,
    pub seconds: f64,
}

/// The scored items of the multiple-choice cell in flight (`partial.jsonl`).
/// Blocks are appended and flushed as they finish; on resume only the
/// blocks of the same cell (key and item count) that continue one another
/// from item 0 are taken, up to a truncated or foreign line, and the file
/// is rewritten with just those. Scores round-trip bit for bit (serde_json
/// `float_roundtrip`), so a resumed cell's row equals an uninterrupted one.
pub struct PartialCell {
    log: Journal,
    key: CellKey,
    items: usize,
}

impl PartialCell {
    pub const FILE: &'static str = "partial.jsonl";

    /// Opens the partial file of cell `key` (`items` items) in `dir`; with
    /// `resume`, also returns the items it already holds for that cell,
    /// otherwise starts it empty.
    pub fn open(dir: &Path, key: &CellKey, items: usize, resume: bool) -> Result<(Self, Resumed)> {
        let mut done = Resumed::default();
        let log = Journal::resume_blocks(dir.join(Self::FILE), resume, |b: PartialBlock| {
            let n = done.scores.len();
            if b.key != *key || b.items != items || b.start != n || n + b.scores.len() > items {
                return false;
            }
            done.scores.extend(b.scores);
            done.seconds += b.seconds;
            true
        })?;
        Ok((PartialCell { log, key: key.clone(), items }, done))
    }

    /// Appends the scores of items `start..start + scores.len()`, which
    /// took `seconds`, and flushes them to the file system.
    pub fn append(&mut self, start: usize, scores: &[Vec<ChoiceScore>], seconds: f64) -> Result<()> {
        let block = PartialBlock { key: self.key.clone(), items: self.items, start, scores: scores.to_vec(), seconds };
        self.log.append(&block, "partial block")
    }

    /// The cell is finished (its row is in `results.jsonl`): removes the file.
    pub fn finish(self) -> Result<()> {
        self.log.finish()
    }
}

/// One block of items of a shared-prefill group (the cells of a generation
/// task run item by item together), as a line of `partial-shared.jsonl`.
#[derive(Serialize, Deserialize)]
struct SharedBlock {
    /// The group's cells, in order: a group of other cells is not resumed.
    keys: Vec<CellKey>,
    items: usize,
    start: usize,
    /// Per item, per cell, the item's generations (one per question).
    gens: Vec<Vec<Vec<Generation>>>,
    seconds: f64,
}

/// The generations a shared-prefill group finished so far
/// (`partial-shared.jsonl`): a cut-off run of a long group resumes after
/// its last finished block instead of starting the group again.
pub struct PartialGroup {
    log: Journal,
    keys: Vec<CellKey>,
    items: usize,
}

/// What an interrupted run of a group left: per item, per cell, its
/// generations, and the seconds spent on them.
pub type ResumedGroup = (Vec<Vec<Vec<Generation>>>, f64);

impl PartialGroup {
    pub const FILE: &'static str = "partial-shared.jsonl";

    /// Opens the file for the group of `keys` over `items` items in `dir`;
    /// with `resume`, also returns the blocks it holds for that group.
    pub fn open(dir: &Path, keys: &[CellKey], items: usize, resume: bool) -> Result<(Self, ResumedGroup)> {
        let (mut gens, mut seconds) = (Vec::new(), 0.0);
        let log = Journal::resume_blocks(dir.join(Self::FILE), resume, |b: SharedBlock| {
            if b.keys != keys || b.items != items || b.start != gens.len() || gens.len() + b.gens.len() > items {
                return false;
            }
            gens.extend(b.gens);
            seconds += b.seconds;
            true
        })?;
        Ok((PartialGroup { log, keys: keys.to_vec(), items }, (gens, seconds)))
    }

    /// Appends the generations of items `start..start + gens.len()`, which
    /// took `seconds`, and flushes them to the file system.
    pub fn append(&mut self, start: usize, gens: &[Vec<Vec<Generation>>], seconds: f64) -> Result<()> {
        let block = SharedBlock { keys: self.keys.clone(), items: self.items, start, gens: gens.to_vec(), seconds };
        self.log.append(&block, "partial block")
    }

    /// The group's generations are complete: removes the file.
    pub fn finish(self) -> Result<()> {
        self.log.finish()
    }
}
