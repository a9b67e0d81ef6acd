//! `tuned:file=PATH`: the policy `kvslim tune` chose, named by the file it
//! wrote, so every place that takes a policy spec (the CLI's `--policy`, a
//! server request's `kv_policy`, config files) takes a tune result through
//! the one grammar.
//!
//! As with a CHAI plan, parsing reads no file: `tuned:file=PATH` parses to a
//! [`PolicySpec`](super::PolicySpec) that only names the file, and
//! [`PolicySpec::load_plans`](super::PolicySpec::load_plans) reads it once
//! and replaces the spec with the one the file records (its `spec` field).
//! The file must say what it is (`"kind": "kvslim-tune"`), so a CHAI plan or
//! any other JSON passed by mistake is refused with the path named rather
//! than half-read. The recorded spec is parsed by the same grammar and may
//! not itself be `tuned:` (no chains of files).

use super::chai::PlanError;

/// The `kind` a tune file declares (written by `kvslim tune`).
pub const TUNE_FILE_KIND: &str = "kvslim-tune";

/// A `tuned:file=PATH` spec before its file was read.
#[derive(Clone, Debug, PartialEq)]
pub struct TunedRef {
    pub path: String,
    /// The page size `compact=`/`page_score=` without `page=` get in the
    /// recorded spec (a server's pool), kept from the parse for the load.
    pub default_page: Option<usize>,
}

/// What can go wrong reading the files a spec names; each names its file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("tuned policy file {path}: {reason}")]
    Tuned { path: String, reason: String },
}

/// The spec string a tune file records, checked to be a tune file.
pub fn read_tuned_spec(path: &str) -> Result<String, LoadError> {
    let err = |reason: String| LoadError::Tuned { path: path.to_string(), reason };
    let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(format!("invalid JSON: {e}")))?;
    match v.get("kind").and_then(|k| k.as_str()) {
        Some(TUNE_FILE_KIND) => {}
        Some(k) => return Err(err(format!("`kind` is `{k}`, not `{TUNE_FILE_KIND}` (a file written by `kvslim tune`)"))),
        None => return Err(err(format!("no `kind: {TUNE_FILE_KIND}` (not a file written by `kvslim tune`)"))),
    }
    match v.get("spec").and_then(|s| s.as_str()) {
        Some(s) if !s.trim().is_empty() => Ok(s.to_string()),
        _ => Err(err("no `spec` string".into())),
    }
}
