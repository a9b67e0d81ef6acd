//! Result files of an evaluation run, all in one directory:
//!
//! * `results.jsonl` — one [`ResultRow`] per finished cell (model × policy
//!   × budget × task), appended and flushed as soon as the cell ends, so a
//!   crash loses at most the cell in flight. A resumed run
//!   ([`ResultsLog::resume`]) reads it back, tolerating a truncated last
//!   line, and skips the cells it holds ([`CellKey`]).
//! * `results.csv` — every row, one metric per column ([`to_csv`]).
//! * `results.md` — per task and model, one table per headline metric:
//!   rows are policies, columns budgets ([`to_markdown`]).
//! * `partial.jsonl` — the scored items of the multiple-choice cell in
//!   flight, a block per line ([`PartialCell`]), so a resumed run continues
//!   that cell from its last finished block instead of its first item (a
//!   whole HellaSwag cell is most of an hour); removed when the cell's row
//!   is written.

use crate::score::ChoiceScore;
use crate::{EvalError, Result};
use kvslim_engine::Generation;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Identifies a cell of the evaluation matrix.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CellKey {
    pub model: String,
    /// Policy family (with extras), e.g. `h2o`, `h2o:agg=max`, `full`.
    pub policy: String,
    /// `20%`, `64`, or `-` when the policy ignores budgets.
    pub budget: String,
    /// [`crate::TaskSpec::label`].
    pub task: String,
    /// Perplexity cells of a quantized KV policy run in mode (a): the K/V
    /// dtype of the reference run whose eviction decisions were followed
    /// (absent: the policy decided on its own cache, mode (b)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decisions_from: Option<String>,
}

/// Non-finite metrics are written as `null` by serde_json; read them back
/// as NaN.
fn nan_map<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<BTreeMap<String, f64>, D::Error> {
    let m: BTreeMap<String, Option<f64>> = BTreeMap::deserialize(d)?;
    Ok(m.into_iter().map(|(k, v)| (k, v.unwrap_or(f64::NAN))).collect())
}

/// One finished cell.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ResultRow {
    /// The cell, its fields written first and flat, as the row's own.
    #[serde(flatten)]
    pub key: CellKey,
    /// Items evaluated (windows for perplexity).
    pub items: usize,
    #[serde(deserialize_with = "nan_map")]
    pub metrics: BTreeMap<String, f64>,
    /// Largest allocated KV bytes of one sequence in the cell.
    #[serde(default)]
    pub kv_bytes: u64,
    /// Largest metadata bytes (scores, positions) of one sequence.
    #[serde(default)]
    pub kv_metadata_bytes: u64,
    /// Seconds: `wall` for the whole cell, others per kind.
    #[serde(default, deserialize_with = "nan_map")]
    pub timings: BTreeMap<String, f64>,
    /// Per-item values behind a metric, in item order, for paired
    /// comparisons against the full cache on the same items
    /// ([`crate::paired`]): `acc` and `acc_norm` (0 or 1 per item), `nll`
    /// (per window); multiple-choice rows add `pick` and `pick_norm` (the
    /// chosen choice's index) and `gold_logprob` (the gold continuation's
    /// summed log-prob, for item-by-item comparisons with other harnesses).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_item: BTreeMap<String, Vec<f64>>,
    pub kvslim_version: String,
    pub git_commit: String,
    /// Seconds since the Unix epoch when the row was made.
    #[serde(default)]
    pub unix_time: u64,
    /// Sharded runs only: the shard (`I/N`) that ran the cell
    /// ([`crate::shard`]); merged results drop it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// Sharded runs only: the run's configuration fingerprint
    /// ([`crate::shard::config_fingerprint`]); merged results drop it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

impl PartialEq for ResultRow {
    /// Equal when every field is, NaN metrics counting as equal.
    fn eq(&self, o: &Self) -> bool {
        let same = |a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>| {
            a.len() == b.len()
                && a.iter().zip(b).all(|((ka, va), (kb, vb))| ka == kb && (va == vb || (va.is_nan() && vb.is_nan())))
        };
        self.key == o.key
            && self.items == o.items
            && same(&self.metrics, &o.metrics)
            && same(&self.timings, &o.timings)
            && self.per_item == o.per_item
            && (self.kv_bytes, self.kv_metadata_bytes, self.unix_time) == (o.kv_bytes, o.kv_metadata_bytes, o.unix_time)
            && (&self.kvslim_version, &self.git_commit) == (&o.kvslim_version, &o.git_commit)
            && (&self.shard, &self.run) == (&o.shard, &o.run)
    }
}

/// The commit of the source tree, from `git rev-parse HEAD` (run once, in
/// this crate's source directory, then in the working directory), else
/// `unknown`.
pub fn git_commit() -> String {
    static COMMIT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    COMMIT
        .get_or_init(|| {
            let run = |dir: Option<&Path>| {
                let mut c = std::process::Command::new("git");
                c.args(["rev-parse", "HEAD"]).stderr(std::process::Stdio::null());
                if let Some(d) = dir {
                    c.current_dir(d);
                }
                let out = c.output().ok().filter(|o| o.status.success())?;
                let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
                (s.len() >= 7 && s.bytes().all(|b| b.is_ascii_hexdigit())).then_some(s)
            };
            let here = Path::new(env!("CARGO_MANIFEST_DIR"));
            run(here.is_dir().then_some(here)).or_else(|| run(None)).unwrap_or_else(|| "unknown".into())
        })
        .clone()
}

impl ResultRow {
    /// A row for a cell with version, commit and time filled in.
    pub fn new(model: &str, policy: &str, budget: &str, task: &str) -> Self {
        ResultRow {
            key: CellKey {
                model: model.into(),
                policy: policy.into(),
                budget: budget.into(),
                task: task.into(),
                decisions_from: None,
            },
            items: 0,
            metrics: BTreeMap::new(),
            kv_bytes: 0,
            kv_metadata_bytes: 0,
            timings: BTreeMap::new(),
            per_item: BTreeMap::new(),
            kvslim_version: env!("CARGO_PKG_VERSION").into(),
            git_commit: git_commit(),
            unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            shard: None,
            run: None,
        }
    }

    /// The policy as tables show it: the family, plus `[decisions from D]`
    /// for a mode (a) cell.
    pub fn policy_label(&self) -> String {
        match &self.key.decisions_from {
            Some(d) => format!("{} [decisions from {d}]", self.key.policy),
            None => self.key.policy.clone(),
        }
    }

    /// Sets a metric (builder style).
    pub fn metric(mut self, name: &str, value: f64) -> Self {
        self.metrics.insert(name.into(), value);
        self
    }
}

/// Rows read back from a results file.
#[derive(Debug, Default)]
pub struct ReadRows {
    pub rows: Vec<ResultRow>,
    /// Bytes of an unfinished last line that was ignored (0 if none).
    pub truncated_bytes: usize,
    /// The last line was complete JSON but had no newline.
    pub missing_newline: bool,
}

/// Parses `results.jsonl` content. Every newline-terminated line must be a
/// row (an error names the line); a last line without a newline is taken
/// when it parses and ignored (as a write cut short) when it does not.
pub fn parse_rows(path: &Path, bytes: &[u8]) -> Result<ReadRows> {
    let mut out = ReadRows::default();
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let text = std::str::from_utf8(&bytes[..complete]).map_err(|e| {
        let line = bytes[..e.valid_up_to()].iter().filter(|&&b| b == b'\n').count() + 1;
        EvalError::parse(path, line, "not UTF-8")
    })?;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row =
            serde_json::from_str(line).map_err(|e| EvalError::parse(path, i + 1, format!("not a result row: {e}")))?;
        out.rows.push(row);
    }
    // a crash can cut the last line anywhere, even inside a character
    let tail = &bytes[complete..];
    match serde_json::from_slice::<ResultRow>(tail) {
        Ok(row) => {
            out.rows.push(row);
            out.missing_newline = true;
        }
        Err(_) => out.truncated_bytes = tail.len(),
    }
    Ok(out)
}

/// Reads a results file (missing file: no rows).
pub fn read_rows(path: &Path) -> Result<ReadRows> {
    match std::fs::read(path) {
        Ok(b) => parse_rows(path, &b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ReadRows::default()),
        Err(e) => Err(EvalError::io(path, e)),
    }
}

/// The cells a set of rows has finished.
pub fn finished_keys(rows: &[ResultRow]) -> HashSet<CellKey> {
    rows.iter().map(|r| r.key.clone()).collect()
}

/// The cells finished in `DIR/results.jsonl` (tolerating a truncated last line).
pub fn finished_cells(dir: &Path) -> Result<HashSet<CellKey>> {
    Ok(finished_keys(&read_rows(&dir.join(ResultsLog::FILE))?.rows))
}

/// The append-only `results.jsonl` of a run.
pub struct ResultsLog {
    log: Journal,
}

impl ResultsLog {
    pub const FILE: &'static str = "results.jsonl";

    /// Starts a new log in `dir` (created if needed). Refuses to touch a
    /// log that already holds rows: resume it or remove it.
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| EvalError::io(dir, e))?;
        let path = dir.join(Self::FILE);
        if std::fs::metadata(&path).is_ok_and(|m| m.len() > 0) {
            return Err(EvalError::File {
                path,
                reason: "already holds results; resume the run or remove the file".into(),
            });
        }
        let file = File::create(&path).map_err(|e| EvalError::io(&path, e))?;
        Ok(ResultsLog { log: Journal { path, file } })
    }

    /// Continues the log in `dir` (created when absent): returns the rows
    /// already there. A truncated last line is cut off the file, and a
    /// missing final newline added, so new rows start on a line of their own.
    pub fn resume(dir: &Path) -> Result<(Self, Vec<ResultRow>)> {
        std::fs::create_dir_all(dir).map_err(|e| EvalError::io(dir, e))?;
        let path = dir.join(Self::FILE);
        let read = read_rows(&path)?;
        let mut file = OpenOptions::new().create(true).append(true).open(&path).map_err(|e| EvalError::io(&path, e))?;
        if read.truncated_bytes > 0 {
            let len = file.metadata().map_err(|e| EvalError::io(&path, e))?.len();
            file.set_len(len - read.truncated_bytes as u64).map_err(|e| EvalError::io(&path, e))?;
        }
        if read.missing_newline {
            file.write_all(b"\n").map_err(|e| EvalError::io(&path, e))?;
        }
        Ok((ResultsLog { log: Journal { path, file } }, read.rows))
    }

    /// [`create`](Self::create) or [`resume`](Self::resume).
    pub fn open(dir: &Path, resume: bool) -> Result<(Self, Vec<ResultRow>)> {
        if resume {
            Self::resume(dir)
        } else {
            Ok((Self::create(dir)?, Vec::new()))
        }
    }

    pub fn path(&self) -> &Path {
        &self.log.path
    }

    /// Appends one row as a JSON line and flushes it to the file system.
    pub fn append(&mut self, row: &ResultRow) -> Result<()> {
        self.log.append(row, "result row")
    }
}

/// An append-only JSON-lines file whose lines reach the file system as
/// they are written: the results log and the partial files of cells and
/// groups in flight.
struct Journal {
    path: PathBuf,
    file: File,
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
    fn append(&mut self, value: &impl Serialize, what: &str) -> Result<()> {
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

/// Keeps the last row of each cell, in first-appearance order.
fn dedup(rows: &[ResultRow]) -> Vec<&ResultRow> {
    let mut order: Vec<CellKey> = Vec::new();
    let mut last: BTreeMap<CellKey, &ResultRow> = BTreeMap::new();
    for r in rows {
        let k = r.key.clone();
        if last.insert(k.clone(), r).is_none() {
            order.push(k);
        }
    }
    order.iter().map(|k| last[k]).collect()
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) || s.starts_with(' ') || s.ends_with(' ') {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        String::new()
    }
}

/// Every row (the last one per cell) as CSV: identity columns (plus
/// `decisions_from` when some row followed a reference's decisions; empty
/// for the policy's own), `items`,
/// one column per metric (sorted union; empty when absent or not finite),
/// `kv_bytes`, `kv_metadata_bytes`, one `time_*` column per timing,
/// version and commit.
pub fn to_csv(rows: &[ResultRow]) -> String {
    let rows = dedup(rows);
    let metrics: BTreeSet<&str> = rows.iter().flat_map(|r| r.metrics.keys().map(String::as_str)).collect();
    let timings: BTreeSet<&str> = rows.iter().flat_map(|r| r.timings.keys().map(String::as_str)).collect();
    let follows = rows.iter().any(|r| r.key.decisions_from.is_some());
    let mut head: Vec<String> = ["model", "policy", "budget", "task"].iter().map(|s| s.to_string()).collect();
    if follows {
        head.push("decisions_from".into());
    }
    head.push("items".into());
    head.extend(metrics.iter().map(|m| m.to_string()));
    head.extend(["kv_bytes".to_string(), "kv_metadata_bytes".to_string()]);
    head.extend(timings.iter().map(|t| format!("time_{t}")));
    head.extend(["kvslim_version".to_string(), "git_commit".to_string()]);
    let mut out = head.iter().map(|h| csv_field(h)).collect::<Vec<_>>().join(",");
    out.push('\n');
    for r in rows {
        let mut f =
            vec![csv_field(&r.key.model), csv_field(&r.key.policy), csv_field(&r.key.budget), csv_field(&r.key.task)];
        if follows {
            f.push(csv_field(r.key.decisions_from.as_deref().unwrap_or("")));
        }
        f.push(r.items.to_string());
        f.extend(metrics.iter().map(|m| r.metrics.get(*m).map_or(String::new(), |v| num(*v))));
        f.push(r.kv_bytes.to_string());
        f.push(r.kv_metadata_bytes.to_string());
        f.extend(timings.iter().map(|t| r.timings.get(*t).map_or(String::new(), |v| num(*v))));
        f.push(csv_field(&r.kvslim_version));
        f.push(csv_field(&r.git_commit));
        out.push_str(&f.join(","));
        out.push('\n');
    }
    out
}

/// Metrics that get a markdown table, in this order, when present.
pub const HEADLINE_METRICS: &[&str] =
    &["acc", "acc_norm", "ppl", "nll", "kl", "top1", "exact", "edit_sim", "first_div", "prefix_frac", "agree_frac"];

/// Budget columns: percentages from large to small, then slot counts from
/// large to small, then anything else in first-appearance order. `-` (a
/// policy that ignores budgets) is not a column.
fn budget_order(budgets: &[&str]) -> Vec<String> {
    let mut pct: Vec<(f64, &str)> = Vec::new();
    let mut slots: Vec<(u64, &str)> = Vec::new();
    let mut other: Vec<&str> = Vec::new();
    for &b in budgets {
        if b == "-" || pct.iter().any(|p| p.1 == b) || slots.iter().any(|s| s.1 == b) || other.contains(&b) {
            continue;
        }
        if let Some(p) = b.strip_suffix('%').and_then(|p| p.parse::<f64>().ok()) {
            pct.push((p, b));
        } else if let Ok(n) = b.parse::<u64>() {
            slots.push((n, b));
        } else {
            other.push(b);
        }
    }
    pct.sort_by(|a, b| b.0.total_cmp(&a.0));
    slots.sort_by_key(|s| std::cmp::Reverse(s.0));
    pct.iter().map(|p| p.1).chain(slots.iter().map(|s| s.1)).chain(other).map(String::from).collect()
}

fn cell(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Markdown: per (task, model) in first-appearance order, a table for each
/// [`HEADLINE_METRICS`] entry present; rows are policies (first-appearance
/// order), columns budgets (percentages large to small, then slot counts); a policy run without a
/// budget (`-`, e.g. `full`) shows its one value in every column.
pub fn to_markdown(rows: &[ResultRow]) -> String {
    let rows = dedup(rows);
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for r in &rows {
        if !groups.contains(&(r.key.task.as_str(), r.key.model.as_str())) {
            groups.push((&r.key.task, &r.key.model));
        }
    }
    let mut out = String::from("# Results\n");
    for (task, model) in groups {
        let g: Vec<&&ResultRow> = rows.iter().filter(|r| r.key.task == task && r.key.model == model).collect();
        let budgets = budget_order(&g.iter().map(|r| r.key.budget.as_str()).collect::<Vec<_>>());
        let budgets = if budgets.is_empty() { vec!["-".to_string()] } else { budgets };
        let mut policies: Vec<String> = Vec::new();
        for r in &g {
            if !policies.contains(&r.policy_label()) {
                policies.push(r.policy_label());
            }
        }
        let items = g.iter().map(|r| r.items).max().unwrap_or(0);
        for &metric in HEADLINE_METRICS {
            if !g.iter().any(|r| r.metrics.contains_key(metric)) {
                continue;
            }
            out.push_str(&format!("\n## {} — {} ({}, {} items)\n\n", md_escape(task), metric, md_escape(model), items));
            out.push_str("| policy |");
            for b in &budgets {
                out.push_str(&format!(" {} |", md_escape(b)));
            }
            out.push_str("\n|---|");
            out.push_str(&"---:|".repeat(budgets.len()));
            out.push('\n');
            for p in &policies {
                out.push_str(&format!("| {} |", md_escape(p)));
                let unbudgeted = g.iter().find(|r| r.policy_label() == *p && r.key.budget == "-");
                for b in &budgets {
                    let r = g.iter().find(|r| r.policy_label() == *p && r.key.budget == *b).or(unbudgeted);
                    let v = r.and_then(|r| {
                        let v = cell(*r.metrics.get(metric)?);
                        // accuracy with its standard error
                        Some(match (metric, r.metrics.get("acc_stderr")) {
                            ("acc", Some(se)) => format!("{v} ± {}", cell(*se)),
                            _ => v,
                        })
                    });
                    out.push_str(&format!(" {} |", v.unwrap_or_default()));
                }
                out.push('\n');
            }
        }
        paired_tables(&mut out, task, model, &g, &budgets, &policies);
    }
    out
}

/// Per-item metrics compared in pairs against the full cache.
const PAIRED_METRICS: &[&str] = &["acc", "acc_norm", "nll"];

/// For each [`PAIRED_METRICS`] entry with per-item values: a table of each
/// policy's mean difference from the plain full cache on the same items
/// with its paired 95% interval (`*`: the interval excludes 0).
fn paired_tables(
    out: &mut String,
    task: &str,
    model: &str,
    g: &[&&ResultRow],
    budgets: &[String],
    policies: &[String],
) {
    let Some(full) = g.iter().find(|r| r.key.policy == "full" && r.key.budget == "-" && r.key.decisions_from.is_none())
    else {
        return;
    };
    for &metric in PAIRED_METRICS {
        let Some(base) = full.per_item.get(metric) else { continue };
        let others: Vec<&String> = policies.iter().filter(|p| **p != full.policy_label()).collect();
        if !g.iter().any(|r| r.policy_label() != full.policy_label() && r.per_item.contains_key(metric)) {
            continue;
        }
        out.push_str(&format!(
            "\n## {} — {metric} − full, paired 95% CI ({}, {} items)\n\n| policy |",
            md_escape(task),
            md_escape(model),
            base.len()
        ));
        for b in budgets {
            out.push_str(&format!(" {} |", md_escape(b)));
        }
        out.push_str("\n|---|");
        out.push_str(&"---:|".repeat(budgets.len()));
        out.push('\n');
        for p in others {
            out.push_str(&format!("| {} |", md_escape(p)));
            let unbudgeted = g.iter().find(|r| r.policy_label() == *p && r.key.budget == "-");
            for b in budgets {
                let r = g.iter().find(|r| r.policy_label() == *p && r.key.budget == *b).or(unbudgeted);
                let v =
                    r.and_then(|r| crate::paired::paired(r.per_item.get(metric)?, base)).map_or(String::new(), |d| {
                        let star = if d.significant() { " *" } else { "" };
                        format!("{:+.4} [{:+.4}, {:+.4}]{star}", d.diff, d.lo, d.hi)
                    });
                out.push_str(&format!(" {v} |"));
            }
            out.push('\n');
        }
        out.push_str("\n`*`: the interval excludes 0 (significant at 5%).\n");
    }
}

/// Writes `results.csv` and `results.md` into `dir`.
pub fn write_summaries(dir: &Path, rows: &[ResultRow]) -> Result<()> {
    write_summaries_noted(dir, rows, None)
}

/// [`write_summaries`] with a paragraph under `results.md`'s title (what
/// the rows are, e.g. a partial merge).
pub fn write_summaries_noted(dir: &Path, rows: &[ResultRow], note: Option<&str>) -> Result<()> {
    let mut md = to_markdown(rows);
    if let Some(note) = note {
        let title_end = md.find('\n').map_or(md.len(), |i| i + 1);
        md.insert_str(title_end, &format!("\n{note}\n"));
    }
    for (name, text) in [("results.csv", to_csv(rows)), ("results.md", md)] {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| EvalError::io(&p, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_sort_large_to_small() {
        assert_eq!(
            budget_order(&["20%", "-", "5%", "100%", "64", "128", "20%", "x"]),
            ["100%", "20%", "5%", "128", "64", "x"]
        );
    }

    #[test]
    fn csv_quotes_when_needed() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(num(f64::NAN), "");
        assert_eq!(cell(0.51234), "0.5123");
        assert_eq!(cell(12.345), "12.35");
    }

    #[test]
    fn markdown_shows_stderr_and_paired_differences_against_full() {
        let row = |policy: &str, budget: &str, acc: &[f64]| {
            let mut r = ResultRow::new("m", policy, budget, "mc:x")
                .metric("acc", acc.iter().sum::<f64>() / acc.len() as f64)
                .metric("acc_stderr", 0.05);
            r.per_item.insert("acc".into(), acc.to_vec());
            r
        };
        let full: Vec<f64> = (0..40).map(|i| f64::from(u8::from(i % 2 == 0))).collect();
        // h2o 20% loses 8 of full's correct items: significant; window loses one, gains one: not
        let mut worse = full.clone();
        (0..16).step_by(2).for_each(|i| worse[i] = 0.0);
        let mut same = full.clone();
        (same[0], same[1]) = (0.0, 1.0);
        let md = to_markdown(&[row("full", "-", &full), row("h2o", "20%", &worse), row("window", "20%", &same)]);
        assert!(md.contains("| full | 0.5000 ± 0.0500 |"), "{md}");
        assert!(md.contains("## mc:x — acc − full, paired 95% CI (m, 40 items)"), "{md}");
        let line = |p: &str| md.lines().rfind(|l| l.starts_with(&format!("| {p} |"))).unwrap().to_string();
        assert!(line("h2o").starts_with("| h2o | -0.2000 [") && line("h2o").ends_with("* |"), "{md}");
        assert!(line("window").starts_with("| window | +0.0000 [") && !line("window").contains('*'), "{md}");
    }
}
