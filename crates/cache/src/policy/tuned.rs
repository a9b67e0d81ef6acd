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
        Some(k) => {
            return Err(err(format!("`kind` is `{k}`, not `{TUNE_FILE_KIND}` (a file written by `kvslim tune`)")))
        }
        None => return Err(err(format!("no `kind: {TUNE_FILE_KIND}` (not a file written by `kvslim tune`)"))),
    }
    match v.get("spec").and_then(|s| s.as_str()) {
        Some(s) if !s.trim().is_empty() => Ok(s.to_string()),
        _ => Err(err("no `spec` string".into())),
    }
}

#[cfg(test)]
mod tests {
    use crate::{CacheError, CacheShape, PolicySpec, SequenceCache};

    fn file(name: &str, text: &str) -> String {
        let p = std::env::temp_dir().join(format!("kvslim-tuned-{name}-{}.json", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    #[test]
    fn a_tuned_spec_names_its_file_until_loaded() {
        let path =
            file("ok", r#"{"kind": "kvslim-tune", "spec": "h2o:heavy=26,recent=25,score=decay:0.9", "kl": 0.1}"#);
        let text = format!("tuned:file={path}");
        let mut p = PolicySpec::parse(&text).unwrap();
        assert_eq!(p.tuned.as_ref().map(|t| t.path.as_str()), Some(path.as_str()));
        assert_eq!(p.to_string(), text, "prints as written until loaded");
        assert_eq!(PolicySpec::parse(&p.to_string()).unwrap(), p);
        // a cache refuses a spec nobody loaded, naming the file
        let shape = CacheShape::plain(2, 2, 1, 4);
        let e = SequenceCache::new(&p, shape.clone(), 64, 64).err().unwrap();
        assert!(matches!(e, CacheError::NotLoaded(_)) && e.to_string().contains(&path), "{e}");
        p.load_plans().unwrap();
        let want = PolicySpec::parse("h2o:heavy=26,recent=25,score=decay:0.9").unwrap();
        assert_eq!(p, want);
        assert_eq!(p.budget(1000), Some(51));
        SequenceCache::new(&p, shape, 64, 64).unwrap();
        assert_eq!(PolicySpec::parse_and_load(&text).unwrap(), want);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_server_page_size_reaches_the_recorded_spec() {
        let path = file("page", r#"{"kind": "kvslim-tune", "spec": "h2o:heavy=8,recent=8,compact=64"}"#);
        let p = PolicySpec::parse_and_load_with_page(&format!("tuned:file={path}"), Some(16)).unwrap();
        assert_eq!((p.storage.page_size, p.storage.compact_every), (Some(16), Some(64)));
        let e = PolicySpec::parse_and_load(&format!("tuned:file={path}")).unwrap_err().to_string();
        assert!(e.contains(&path) && e.contains("paged store"), "{e}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn bad_tune_files_and_specs_name_the_problem() {
        let load = |text: &str| PolicySpec::parse_and_load(text).unwrap_err().to_string();
        let e = load("tuned:file=/no/such/tune.json");
        assert!(e.contains("tuned policy file /no/such/tune.json: cannot read"), "{e}");
        for (name, body, want) in [
            ("json", "{not json", "invalid JSON"),
            ("plan", r#"{"layers": []}"#, "no `kind: kvslim-tune`"),
            ("kind", r#"{"kind": "chai-plan", "spec": "full"}"#, "`kind` is `chai-plan`"),
            ("nospec", r#"{"kind": "kvslim-tune"}"#, "no `spec` string"),
            ("badspec", r#"{"kind": "kvslim-tune", "spec": "h2o:heavy=1"}"#, "needs `recent=`"),
            ("chain", r#"{"kind": "kvslim-tune", "spec": "tuned:file=other.json"}"#, "another tune file"),
        ] {
            let path = file(name, body);
            let e = load(&format!("tuned:file={path}"));
            assert!(e.contains(&path) && e.contains(want), "{name}: {e}");
            std::fs::remove_file(&path).unwrap();
        }
        // the grammar's refusals: `spec::tests`
    }
}
