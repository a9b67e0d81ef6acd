//! The task-spec grammar (see [`super`]): the kind's name, its file, then
//! `k=v` options, each kind's own set by its [`Task::set`].

use super::kind::{positive, Kind, Task};
use super::KINDS;
use crate::error::{EvalError, Result};
use std::fmt;
use std::path::{Path, PathBuf};

/// A parsed task spec (see the module docs for the grammar).
#[derive(Clone, Debug)]
pub struct TaskSpec {
    pub kind: Box<dyn Task>,
    /// Only the first N items.
    pub limit: Option<usize>,
}

// (derived, it would move the boxes: rust-lang/rust#31740)
impl PartialEq for TaskSpec {
    fn eq(&self, other: &Self) -> bool {
        self.kind.eq_dyn(other.kind.as_ref()) && self.limit == other.limit
    }
}

/// Splits `k=v` options, folding bare values into the previous key's list.
fn options<'a>(parts: impl Iterator<Item = &'a str>) -> std::result::Result<Vec<(&'a str, Vec<&'a str>)>, String> {
    let mut out: Vec<(&str, Vec<&str>)> = Vec::new();
    for part in parts.map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            Some((k, v)) => {
                let k = k.trim();
                if out.iter().any(|(pk, _)| *pk == k) {
                    return Err(format!("option `{k}` given twice"));
                }
                out.push((k, vec![v.trim()]));
            }
            None => match out.last_mut() {
                Some((_, vals)) => vals.push(part),
                None => return Err(format!("`{part}` is not key=value")),
            },
        }
    }
    Ok(out)
}

/// Every kind's names, for errors.
fn known_kinds() -> String {
    KINDS.iter().flat_map(|k| k.names.iter().copied()).collect::<Vec<_>>().join(", ")
}

fn kind_named(name: &str, file: bool) -> Option<(&'static Kind, &'static str)> {
    KINDS.iter().filter(|k| k.file == file).find_map(|k| k.names.iter().find(|n| **n == name).map(|n| (*k, *n)))
}

/// The kind of a bare `FILE` spec, by its extension.
fn kind_of_file(p: &str) -> std::result::Result<(&'static Kind, &'static str), String> {
    if let Some((_, bad)) = kind_named(p, true) {
        return Err(format!("`{bad}` needs a file: {bad}:FILE"));
    }
    if let Some(k) = KINDS.iter().find(|k| k.extensions.iter().any(|e| p.ends_with(e))) {
        return Ok((k, k.names[0]));
    }
    let by_ext: Vec<String> = KINDS
        .iter()
        .filter(|k| !k.extensions.is_empty())
        .map(|k| format!("{} → {}", k.extensions.join("/"), k.names[0]))
        .collect();
    Err(format!(
        "cannot tell the task kind of `{p}`; write KIND:FILE with KIND one of {} (by extension: {})",
        known_kinds(),
        by_ext.join(", ")
    ))
}

impl TaskSpec {
    /// Parses a task spec.
    pub fn parse(spec: &str) -> Result<TaskSpec> {
        Self::parse_inner(spec.trim()).map_err(|reason| EvalError::TaskSpec { spec: spec.to_string(), reason })
    }

    /// [`TaskSpec::parse`], then run-wide defaults for what the spec leaves
    /// out: `limit` items, and `seq_len` for a `ppl:` window without its
    /// own `seq_len=` (`kvslim eval --limit/--seq-len`).
    pub fn parse_with_defaults(spec: &str, limit: Option<usize>, seq_len: Option<usize>) -> Result<TaskSpec> {
        let mut t = Self::parse(spec)?;
        if t.limit.is_none() {
            t.limit = limit;
        }
        if let Some(n) = seq_len.filter(|_| !spec.contains("seq_len=")) {
            t.kind.default_seq_len(n).map_err(|reason| EvalError::TaskSpec { spec: spec.to_string(), reason })?;
        }
        Ok(t)
    }

    fn parse_inner(spec: &str) -> std::result::Result<TaskSpec, String> {
        if spec.is_empty() {
            return Err(format!("empty task; known kinds: {}, or a file path", known_kinds()));
        }
        // a task without a file: `vt`, `vt:lengths=…`, `vt,limit=2`
        let head = spec.split([':', ',']).next().unwrap_or_default();
        let (kind, rest) = match spec.split_once(':') {
            Some((k, r)) if kind_named(k.trim(), true).is_some() => (kind_named(k.trim(), true), r),
            _ if kind_named(head.trim(), false).is_some() => {
                (kind_named(head.trim(), false), spec[head.len()..].trim_start_matches([':', ',']))
            }
            _ => (None, spec),
        };
        let mut parts = rest.split(',');
        let has_file = kind.is_none_or(|(k, _)| k.file);
        let path = if has_file { parts.next().map(str::trim).filter(|p| !p.is_empty()) } else { None };
        let (kind, name) = match (kind, path) {
            (Some((k, name)), _) if !k.file => (k, name),
            (_, None) => {
                let name = kind.map_or("", |(_, n)| n);
                return Err(format!("`{}` needs a file: {name}:FILE", if name.is_empty() { "task" } else { name }));
            }
            (Some(k), Some(_)) => k,
            (None, Some(p)) => kind_of_file(p)?,
        };
        let mut task = (kind.new)(name, PathBuf::from(path.unwrap_or_default()));
        let mut limit = None;
        for (k, vals) in options(parts)? {
            if k == "limit" {
                limit = Some(positive(k, &vals)?);
            } else if !task.set(k, &vals)? {
                return Err(format!("unknown option `{k}` for `{name}` (allowed: {})", kind.options));
            }
        }
        task.check()?;
        Ok(TaskSpec { kind: task, limit })
    }

    /// The data file, if the task has one.
    pub fn path(&self) -> Option<&Path> {
        self.kind.path()
    }

    /// A short kind name: `ppl`, `mc`, `hellaswag`, `gen`, or the RULER
    /// task (`passkey`, `niah_single`, …).
    pub fn kind_name(&self) -> &'static str {
        self.kind.name()
    }

    /// The canonical spec with the file name only (no directories): the
    /// task column of result files. Options at their defaults are left out.
    pub fn label(&self) -> String {
        self.render(true)
    }

    /// Fails with the file's name when the task's data file (or a RULER
    /// task's haystack text) cannot be opened, so a run stops before it
    /// writes anything rather than at the task's turn.
    pub fn check_readable(&self) -> Result<()> {
        let Some(path) = self.kind.input()? else { return Ok(()) };
        if path.is_dir() {
            return Err(EvalError::File { path, reason: "is a directory, not a task file".into() });
        }
        std::fs::File::open(&path).map(drop).map_err(|source| EvalError::Io { path, source })
    }

    fn render(&self, short: bool) -> String {
        let mut s = self.kind.render(short);
        if let Some(n) = self.limit {
            s += &format!(",limit={n}");
        }
        s
    }
}

impl fmt::Display for TaskSpec {
    /// The canonical spec, full path included; parses back to `self`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(false))
    }
}

impl std::str::FromStr for TaskSpec {
    type Err = EvalError;
    fn from_str(s: &str) -> Result<Self> {
        TaskSpec::parse(s)
    }
}
