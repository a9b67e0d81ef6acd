//! `results.jsonl`: rows appended as cells finish, read back to resume.

use super::journal::Journal;
use super::{CellKey, ResultRow};
use crate::error::{EvalError, Result};
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

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
