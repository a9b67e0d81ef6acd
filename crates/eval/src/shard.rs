//! Sharded evaluation: one matrix split over `N` independent processes
//! (a Slurm job array, a Kubernetes indexed Job), then merged.
//!
//! * The run's cells, in the canonical order an unsharded [`run_matrix`]
//!   runs them (task-major, then policy, then budget), are numbered
//!   `0, 1, …`; shard `I/N` runs the cells whose number is `I mod N`
//!   (round-robin, so every shard gets a share of every task). The shards
//!   are disjoint and together cover every cell exactly once.
//! * A shard writes its own out directory: `results.jsonl` whose rows carry
//!   `shard` (`I/N`) and `run` (the config fingerprint,
//!   [`crate::MatrixConfig::fingerprint`]), the usual `results.csv` / `results.md` of
//!   its own rows, and `shard.json` ([`ShardManifest`]): the fingerprint
//!   and the cells the shard owns with their canonical numbers.
//! * [`merge_shards`] reads `N` shard directories, refuses shards of
//!   different runs, missing or duplicate shards and shards that did not
//!   finish, and writes the unsharded run's files: `results.jsonl` with the
//!   rows in canonical order and without the shard tags, `results.csv`,
//!   `results.md` and (optionally) `plots/`, regenerated from the merged
//!   rows. A `partial` merge takes whatever is finished so far (missing
//!   shards, cells still running), so a long run can be looked at midway;
//!   its `results.md` says how many cells it holds.
//!
//! Each row keeps the timings and the `unix_time` measured in its shard,
//! so those (the `time_*` CSV columns) differ from any other run, sharded
//! or not, as they do between two unsharded runs; everything else is the
//! same as the unsharded run's.
//!
//! [`run_matrix`]: crate::run_matrix

use crate::error::{EvalError, Result, Setting};
use crate::results::{write_summaries_noted, CellKey, ResultRow, ResultsLog};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Shard `index` of `count` (0-based; written `I/N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// Whether the cell with canonical number `n` belongs to this shard.
    pub fn owns(&self, n: usize) -> bool {
        n % self.count == self.index
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = String;

    /// Parses `I/N` with `0 <= I < N`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("shard `{s}`: expected I/N, the 0-based shard index I of N shards (e.g. 0/4)");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: usize = i.trim().parse().map_err(|_| bad())?;
        let count: usize = n.trim().parse().map_err(|_| bad())?;
        if count == 0 {
            return Err(format!("shard `{s}`: the number of shards must be at least 1"));
        }
        if index >= count {
            return Err(format!("shard `{s}`: index {index} is out of range, shards are numbered 0..{}", count - 1));
        }
        Ok(Shard { index, count })
    }
}

/// A cell a shard owns, as `shard.json` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestCell {
    /// Canonical number of the cell in the whole run.
    pub n: usize,
    #[serde(flatten)]
    pub key: CellKey,
}

/// `shard.json` in a shard's out directory, written before its first cell.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardManifest {
    /// `I/N`.
    pub shard: String,
    /// [`crate::MatrixConfig::fingerprint`] of the run.
    pub run: String,
    /// Cells of the whole run.
    pub total_cells: usize,
    /// The cells this shard owns, in canonical order.
    pub cells: Vec<ManifestCell>,
}

impl ShardManifest {
    pub const FILE: &'static str = "shard.json";

    /// The manifest of `shard` for a run whose cells, in canonical order, are `all`.
    pub fn new(shard: Shard, run: &str, all: &[CellKey]) -> Self {
        let cells = all
            .iter()
            .enumerate()
            .filter(|(n, _)| shard.owns(*n))
            .map(|(n, k)| ManifestCell { n, key: k.clone() })
            .collect();
        ShardManifest { shard: shard.to_string(), run: run.into(), total_cells: all.len(), cells }
    }

    /// Reads `DIR/shard.json`.
    pub fn read(dir: &Path) -> Result<Self> {
        let p = dir.join(Self::FILE);
        let bytes = std::fs::read(&p).map_err(|e| EvalError::io(&p, e))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| EvalError::File { path: p, reason: format!("not a shard manifest: {e}") })
    }

    /// Writes `DIR/shard.json`. When resuming, an existing manifest must be
    /// this one (same run and shard).
    pub fn write(&self, dir: &Path, resume: bool) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| EvalError::io(dir, e))?;
        let p = dir.join(Self::FILE);
        if resume && p.exists() {
            let old = Self::read(dir)?;
            if (old.shard.as_str(), old.run.as_str()) != (self.shard.as_str(), self.run.as_str()) {
                let before = format!(
                    "{}: holds shard {} of run {}, not shard {} of run {}: resume with the same configuration \
                     or use another ",
                    p.display(),
                    old.shard,
                    old.run,
                    self.shard,
                    self.run
                );
                return Err(EvalError::setting(Setting::OutDir, None, before, ""));
            }
        }
        let text =
            serde_json::to_string_pretty(self).map_err(|e| EvalError::Request(format!("shard manifest: {e}")))?;
        std::fs::write(&p, text + "\n").map_err(|e| EvalError::io(&p, e))
    }
}

/// How [`merge_shards`] merges.
#[derive(Clone, Copy, Debug, Default)]
pub struct MergeOptions {
    /// Draw `plots/` from the merged rows.
    pub charts: bool,
    /// Merge what is finished so far: missing shards and unfinished cells
    /// are left out instead of refused.
    pub partial: bool,
    /// Replace the merged results `out` already holds (a merge run again,
    /// e.g. after a failed shard was resumed) instead of refusing them.
    pub replace: bool,
}

/// What a merge writes into its `out` directory, and all it replaces there.
const MERGED_FILES: [&str; 4] = ["plots", "results.csv", "results.md", ResultsLog::FILE];

/// Where a merge writes its files before moving them into `out`: inside
/// `out`, so the moves are renames on one file system.
const STAGING: &str = ".merge-staging";

/// What [`merge_shards`] wrote.
#[derive(Clone, Debug)]
pub struct Merged {
    /// The merged rows, in the unsharded run's order.
    pub rows: Vec<ResultRow>,
    /// Cells of the whole run (more than `rows.len()` only in a partial merge).
    pub total_cells: usize,
    /// Shards not given (`I/N`; a partial merge only).
    pub missing_shards: Vec<String>,
}

impl Merged {
    /// How much of the run the merge holds: `K of its N cells are
    /// finished`, and the shards not given if any.
    pub fn coverage(&self) -> String {
        let shards = if self.missing_shards.is_empty() {
            String::new()
        } else {
            format!("; shards not given: {}", self.missing_shards.join(", "))
        };
        format!("{} of its {} cells are finished{shards}", self.rows.len(), self.total_cells)
    }
}

/// Merges the out directories of all `N` shards of one run into `out`
/// (created if needed; must not hold results yet unless `replace`):
/// `results.jsonl` with every row in the unsharded run's order and without
/// shard tags, `results.csv`, `results.md`, and with `charts` the `plots/`.
/// The files are written into `out/.merge-staging` first and then moved
/// into place, so a merge that fails leaves `out` as it was; with
/// `replace` the old files (and an old `plots/`) give way to the new ones.
///
/// Errors, each naming the directory: a directory that is no shard (no
/// `shard.json`), shards of different runs (fingerprints differ), a shard
/// given twice, a shard whose `results.jsonl` holds a cell it does not
/// own, and unless `partial`, a missing shard or one whose `results.jsonl`
/// lacks one of its cells (not finished).
pub fn merge_shards(dirs: &[PathBuf], out: &Path, opts: MergeOptions) -> Result<Merged> {
    if dirs.is_empty() {
        return Err(EvalError::Request("merge: no shard directories given".into()));
    }
    let existing = out.join(ResultsLog::FILE);
    if !opts.replace && std::fs::metadata(&existing).is_ok_and(|m| m.len() > 0) {
        let before = format!("{}: already holds results; merge with ", existing.display());
        return Err(EvalError::setting(
            Setting::Replace,
            None,
            before,
            " to overwrite them, or into another directory",
        ));
    }
    let mut by_index: BTreeMap<usize, (&PathBuf, ShardManifest)> = BTreeMap::new();
    let mut first: Option<(PathBuf, Shard, ShardManifest)> = None;
    for d in dirs {
        let m = ShardManifest::read(d)?;
        let shard: Shard =
            m.shard.parse().map_err(|e: String| EvalError::File { path: d.join(ShardManifest::FILE), reason: e })?;
        match &first {
            None => first = Some((d.clone(), shard, m.clone())),
            Some((d0, s0, m0)) => {
                if m.run != m0.run || shard.count != s0.count || m.total_cells != m0.total_cells {
                    return Err(EvalError::Request(format!(
                        "merge: {} (shard {shard}, run {}) and {} (shard {s0}, run {}) come from different runs",
                        d.display(),
                        m.run,
                        d0.display(),
                        m0.run
                    )));
                }
            }
        }
        if let Some((other, _)) = by_index.get(&shard.index) {
            return Err(EvalError::Request(format!(
                "merge: shard {shard} given twice: {} and {}",
                other.display(),
                d.display()
            )));
        }
        by_index.insert(shard.index, (d, m));
    }
    let (_, s0, m0) = first.expect("dirs is not empty");
    let missing: Vec<String> =
        (0..s0.count).filter(|i| !by_index.contains_key(i)).map(|i| format!("{i}/{}", s0.count)).collect();
    if !missing.is_empty() && !opts.partial {
        return Err(EvalError::Request(format!(
            "merge: run {} has {} shards; missing shard {}",
            m0.run,
            s0.count,
            missing.join(", ")
        )));
    }
    let mut slots: Vec<Option<ResultRow>> = vec![None; m0.total_cells];
    for (d, m) in by_index.values() {
        let log = d.join(ResultsLog::FILE);
        let read = crate::results::read_rows(&log)?;
        let mut owned: BTreeMap<CellKey, usize> = BTreeMap::new();
        for c in &m.cells {
            if c.n >= m0.total_cells || slots[c.n].is_some() || owned.insert(c.key.clone(), c.n).is_some() {
                return Err(EvalError::File {
                    path: d.join(ShardManifest::FILE),
                    reason: format!("cell {} listed twice or out of range", c.n),
                });
            }
        }
        let mut got: BTreeMap<usize, ResultRow> = BTreeMap::new();
        for r in read.rows {
            if r.run.as_deref().is_some_and(|run| run != m.run) {
                return Err(EvalError::File {
                    path: log,
                    reason: format!("holds a row of run {}, not {}", r.run.unwrap_or_default(), m.run),
                });
            }
            let Some(&n) = owned.get(&r.key) else {
                return Err(EvalError::File {
                    path: log,
                    reason: format!(
                        "holds cell {} {} {} that shard {} does not own",
                        r.key.task, r.key.policy, r.key.budget, m.shard
                    ),
                });
            };
            // a resumed log may repeat a cell: the last row wins, as in results.csv
            got.insert(n, r);
        }
        if let Some(c) = m.cells.iter().find(|c| !got.contains_key(&c.n)).filter(|_| !opts.partial) {
            let before = format!(
                "{}: shard {} is not finished: {} of its {} cells are done, cell {} {} {} is missing (rerun it with ",
                log.display(),
                m.shard,
                got.len(),
                m.cells.len(),
                c.key.task,
                c.key.policy,
                c.key.budget
            );
            return Err(EvalError::setting(Setting::Resume, None, before, ")"));
        }
        for (n, mut r) in got {
            r.shard = None;
            r.run = None;
            slots[n] = Some(r);
        }
    }
    let rows: Vec<ResultRow> = if opts.partial {
        slots.into_iter().flatten().collect()
    } else {
        slots
            .into_iter()
            .enumerate()
            .map(|(n, r)| r.ok_or_else(|| EvalError::Request(format!("merge: no shard owns cell {n}"))))
            .collect::<Result<_>>()?
    };
    let merged = Merged { rows, total_cells: m0.total_cells, missing_shards: missing };
    let note = opts.partial.then(|| format!("Partial merge of run {}: {}.", m0.run, merged.coverage()));
    let stage = out.join(STAGING);
    remove_any(&stage)?; // left over by an interrupted merge
    {
        let mut log = ResultsLog::create(&stage)?;
        for r in &merged.rows {
            log.append(r)?;
        }
    }
    write_summaries_noted(&stage, &merged.rows, note.as_deref())?;
    if opts.charts {
        crate::plots::write_charts(&stage.join("plots"), &merged.rows)?;
    }
    for name in MERGED_FILES {
        let (from, to) = (stage.join(name), out.join(name));
        remove_any(&to)?;
        if from.exists() {
            std::fs::rename(&from, &to).map_err(|e| EvalError::io(&to, e))?;
        }
    }
    std::fs::remove_dir(&stage).map_err(|e| EvalError::io(&stage, e))?;
    Ok(merged)
}

/// Removes a file or a directory tree; absent is fine.
fn remove_any(p: &Path) -> Result<()> {
    let r = match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
    };
    r.map_err(|e| EvalError::io(p, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects_shards() {
        assert_eq!("2/3".parse::<Shard>(), Ok(Shard { index: 2, count: 3 }));
        assert_eq!("0/1".parse::<Shard>().unwrap().to_string(), "0/1");
        for bad in ["3/2", "2/2", "x", "1", "1/0", "-1/2", "a/b", ""] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        assert!("3/2".parse::<Shard>().unwrap_err().contains("out of range"));
        assert!("x".parse::<Shard>().unwrap_err().contains("expected I/N"));
    }

    #[test]
    fn shards_cover_every_cell_once() {
        for count in 1..6 {
            for n in 0..17 {
                let owners = (0..count).filter(|&index| Shard { index, count }.owns(n)).count();
                assert_eq!(owners, 1);
            }
        }
    }
}
