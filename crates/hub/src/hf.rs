//! `hf:org/repo[/file]` specs: files of a Hugging Face repository, read
//! from the same cache layout `huggingface_hub` uses (so downloads are
//! shared with Python tools) and fetched with the `hf-hub` client when
//! absent.

use crate::{err, Env, Error, Result};
use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};
use std::path::{Path, PathBuf};

struct HfSpec<'a> {
    org: &'a str,
    repo: &'a str,
    /// A file inside the repository, or `None` for the whole checkpoint.
    file: Option<&'a str>,
}

fn parse_hf(rest: &str) -> Option<HfSpec<'_>> {
    let mut parts = rest.splitn(3, '/');
    let org = parts.next()?;
    let repo = parts.next()?;
    let file = parts.next().map(|f| f.trim_end_matches('/')).filter(|f| !f.is_empty());
    let plain = |s: &str| !s.is_empty() && s != "." && s != ".." && !s.contains('\\') && !s.contains("--");
    if !plain(org) || !plain(repo) {
        return None;
    }
    if let Some(f) = file {
        if f.split('/').any(|c| c.is_empty() || c == "." || c == ".." || c.contains('\\')) {
            return None;
        }
    }
    Some(HfSpec { org, repo, file })
}

/// The cache folder of one repository and what it holds.
struct HfRepo<'a> {
    spec: &'a str,
    env: &'a Env,
    org: &'a str,
    repo: &'a str,
    /// The hub cache and the repository's folder in it.
    hub: PathBuf,
    dir: PathBuf,
    /// The commit `refs/main` points to, once known.
    commit: Option<String>,
}

impl<'a> HfRepo<'a> {
    fn new(spec: &'a str, env: &'a Env, hub: &Path, org: &'a str, repo: &'a str) -> Self {
        let dir = hub.join(format!("models--{org}--{repo}"));
        let commit = std::fs::read_to_string(dir.join("refs/main"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| valid_commit(s));
        HfRepo { spec, env, org, repo, hub: hub.to_path_buf(), dir, commit }
    }

    /// Snapshot folders to search: the one `refs/main` names, or, without
    /// a ref, every snapshot (sorted, for a deterministic choice).
    fn snapshots(&self) -> Vec<PathBuf> {
        if let Some(c) = &self.commit {
            return vec![self.dir.join("snapshots").join(c)];
        }
        let mut v: Vec<PathBuf> = std::fs::read_dir(self.dir.join("snapshots"))
            .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    fn cached_file(&self, file: &str) -> Option<PathBuf> {
        self.snapshots().into_iter().map(|s| s.join(file)).find(|p| p.is_file())
    }

    /// A snapshot holding a complete safetensors checkpoint.
    fn cached_checkpoint(&self) -> Option<PathBuf> {
        self.snapshots().into_iter().find(|s| s.join("config.json").is_file() && weights_complete(s))
    }

    fn url(&self, file: &str) -> String {
        format!("{}/{}/{}/resolve/main/{}", self.env.hf_endpoint, self.org, self.repo, file)
    }

    /// Downloads `file` of the repository's `main` revision with the
    /// `hf-hub` client into the cache (blob under `blobs/`, linked from
    /// `snapshots/<commit>/`, `refs/main` updated), with a progress bar on
    /// a terminal. Every file of one resolution must land in the snapshot
    /// of the first: a repository that moves on mid-way is an error.
    fn fetch(&mut self, file: &str) -> Result<PathBuf, String> {
        if let Some(c) = &self.commit {
            let p = self.dir.join("snapshots").join(c).join(file);
            if p.is_file() {
                return Ok(p);
            }
        }
        let url = self.url(file);
        eprintln!("kvslim: downloading {url}");
        let mut builder = ApiBuilder::from_cache(Cache::new(self.hub.clone()))
            .with_endpoint(self.env.hf_endpoint.clone())
            .with_retries(2)
            .with_progress(true);
        // without HF_TOKEN, hf-hub reads the token file huggingface-cli
        // login writes next to the hub cache
        if let Some(t) = &self.env.hf_token {
            builder = builder.with_token(Some(t.clone()));
        }
        let api = builder.build().map_err(|e| format!("cannot set up the Hugging Face client: {e}"))?;
        let repo = api.repo(Repo::new(format!("{}/{}", self.org, self.repo), RepoType::Model));
        let path = repo.download(file).map_err(|e| format!("downloading {url} failed: {e}"))?;
        let commit = path
            .strip_prefix(self.dir.join("snapshots"))
            .ok()
            .and_then(|rel| rel.components().next())
            .map(|c| c.as_os_str().to_string_lossy().into_owned());
        match (&self.commit, commit) {
            (_, None) => Err(format!("the download of {url} landed outside {}", self.dir.display())),
            (Some(pinned), Some(got)) if *pinned != got => Err(format!(
                "the repository moved from commit {pinned} to {got} while downloading; run the command again"
            )),
            (_, Some(got)) => {
                self.commit = Some(got);
                Ok(path)
            }
        }
    }

    fn not_cached(&self, what: &str) -> String {
        format!("{what} is not in the Hugging Face cache ({})", self.dir.display())
    }

    fn offline_error(&self, what: &str) -> Error {
        err(
            self.spec,
            format!("{}, and downloads are disabled (HF_HUB_OFFLINE or KVSLIM_OFFLINE is set)", self.not_cached(what)),
        )
    }

    fn download_error(&self, what: &str, why: &str) -> Error {
        err(self.spec, format!("{}, and the download failed: {why}", self.not_cached(what)))
    }

    /// Downloads a whole safetensors checkpoint; returns its snapshot folder.
    fn fetch_checkpoint(&mut self) -> Result<PathBuf, String> {
        let config = self.fetch("config.json")?;
        let snapshot = config.parent().map(Path::to_path_buf).ok_or_else(|| "bad snapshot path".to_string())?;
        if let Err(single) = self.fetch("model.safetensors") {
            let index = self
                .fetch("model.safetensors.index.json")
                .map_err(|idx| format!("neither model.safetensors nor an index could be fetched:\n{single}\n{idx}"))?;
            for shard in index_shards(&index)? {
                self.fetch(&shard)?;
            }
        }
        if let Err(e) = self.fetch("tokenizer.json") {
            eprintln!("kvslim: warning: no tokenizer.json ({e})");
        }
        Ok(snapshot)
    }
}

fn valid_commit(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && s != "."
        && s != ".."
}

/// Shard file names listed by a `model.safetensors.index.json`.
fn index_shards(index: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read(index).map_err(|e| format!("cannot read {}: {e}", index.display()))?;
    let v: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("{}: invalid JSON: {e}", index.display()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| format!("{}: no `weight_map` object", index.display()))?;
    let mut shards: Vec<String> = map.values().filter_map(|f| f.as_str()).map(str::to_string).collect();
    shards.sort_unstable();
    shards.dedup();
    if let Some(bad) = shards.iter().find(|s| s.contains('/') || s.contains("..")) {
        return Err(format!("{}: shard name `{bad}` is not a plain file name", index.display()));
    }
    Ok(shards)
}

/// Whether a snapshot folder holds all of its weights.
fn weights_complete(dir: &Path) -> bool {
    if dir.join("model.safetensors").is_file() {
        return true;
    }
    let index = dir.join("model.safetensors.index.json");
    match index_shards(&index) {
        Ok(shards) => !shards.is_empty() && shards.iter().all(|s| dir.join(s).is_file()),
        Err(_) => false,
    }
}

pub fn resolve(spec: &str, rest: &str, env: &Env) -> Result<PathBuf> {
    let Some(hf) = parse_hf(rest) else {
        return Err(err(spec, "expected `hf:org/repo` (a safetensors checkpoint) or `hf:org/repo/path/to/file`"));
    };
    let Some(hub) = &env.hf_hub else {
        return Err(err(spec, "cannot locate the Hugging Face cache: set HF_HUB_CACHE, HF_HOME or HOME"));
    };
    let mut repo = HfRepo::new(spec, env, hub, hf.org, hf.repo);
    let offline = env.hf_offline || env.offline;
    match hf.file {
        Some(file) => {
            if let Some(p) = repo.cached_file(file) {
                return Ok(p);
            }
            let what = format!("`{file}`");
            if offline {
                return Err(repo.offline_error(&what));
            }
            repo.fetch(file).map_err(|why| repo.download_error(&what, &why))
        }
        None => {
            if let Some(p) = repo.cached_checkpoint() {
                return Ok(p);
            }
            let what = "a complete checkpoint (config.json and safetensors weights)";
            if offline {
                return Err(repo.offline_error(what));
            }
            repo.fetch_checkpoint().map_err(|why| repo.download_error(what, &why))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::resolve_with;
    use crate::testutil::{closed_port, env_in, message, scratch, scratch_env, write, FakeHub};
    use std::path::{Path, PathBuf};

    /// Lays out `models--org--repo` as huggingface_hub does.
    fn fake_hf_repo(hub: &Path, org: &str, repo: &str, commit: &str, files: &[&str]) -> PathBuf {
        let dir = hub.join(format!("models--{org}--{repo}"));
        write(&dir.join("refs/main"), format!("{commit}\n").as_bytes());
        let snap = dir.join("snapshots").join(commit);
        for f in files {
            write(&snap.join(f), b"{}");
        }
        snap
    }

    #[test]
    fn hf_file_from_cache() {
        let (_t, env) = scratch_env("hf-file");
        let hub = env.hf_hub.clone().unwrap();
        let snap = fake_hf_repo(
            &hub,
            "Org",
            "Repo-GGUF",
            "0123456789abcdef0123456789abcdef01234567",
            &["model-q4.gguf", "sub/dir/x.gguf"],
        );
        // an older snapshot is ignored when refs/main names another
        write(&hub.join("models--Org--Repo-GGUF/snapshots/old/other.gguf"), b"x");
        assert_eq!(resolve_with("hf:Org/Repo-GGUF/model-q4.gguf", &env).unwrap(), snap.join("model-q4.gguf"));
        assert_eq!(resolve_with("hf:Org/Repo-GGUF/sub/dir/x.gguf", &env).unwrap(), snap.join("sub/dir/x.gguf"));
        let m = message(resolve_with("hf:Org/Repo-GGUF/other.gguf", &env));
        assert!(m.contains("`other.gguf` is not in the Hugging Face cache"), "{m}");
        assert!(m.contains("HF_HUB_OFFLINE"), "{m}");
    }

    #[test]
    fn hf_file_without_ref_uses_any_snapshot() {
        let (_t, env) = scratch_env("hf-noref");
        let f = env.hf_hub.as_ref().unwrap().join("models--a--b/snapshots/abc123/w.gguf");
        write(&f, b"GGUF");
        assert_eq!(resolve_with("hf:a/b/w.gguf", &env).unwrap(), f);
    }

    #[test]
    fn hf_checkpoint_from_cache() {
        let (_t, env) = scratch_env("hf-ckpt");
        let hub = env.hf_hub.clone().unwrap();
        let commit = "fedcba9876543210fedcba9876543210fedcba98";
        // single file
        let snap = fake_hf_repo(&hub, "o", "single", commit, &["config.json", "tokenizer.json", "model.safetensors"]);
        assert_eq!(resolve_with("hf:o/single", &env).unwrap(), snap);
        assert_eq!(resolve_with("hf:o/single/", &env).unwrap(), snap);
        // sharded: complete only once every shard is there
        let snap = fake_hf_repo(&hub, "o", "sharded", commit, &["config.json"]);
        write(
            &snap.join("model.safetensors.index.json"),
            br#"{"weight_map": {"a": "model-00001-of-00002.safetensors",
                                "b": "model-00002-of-00002.safetensors"}}"#,
        );
        write(&snap.join("model-00001-of-00002.safetensors"), b"");
        let m = message(resolve_with("hf:o/sharded", &env));
        assert!(m.contains("not in the Hugging Face cache"), "{m}");
        write(&snap.join("model-00002-of-00002.safetensors"), b"");
        assert_eq!(resolve_with("hf:o/sharded", &env).unwrap(), snap);
        // no weights at all
        fake_hf_repo(&hub, "o", "empty", commit, &["config.json"]);
        let m = message(resolve_with("hf:o/empty", &env));
        assert!(m.contains("complete checkpoint"), "{m}");
    }

    #[test]
    fn hf_bad_specs() {
        let (_t, env) = scratch_env("hf-bad");
        for s in ["hf:", "hf:org", "hf:org/", "hf:/repo", "hf:o/r/../x", "hf:../r/x"] {
            let m = message(resolve_with(s, &env));
            assert!(m.contains("expected `hf:org/repo`"), "{s}: {m}");
        }
    }

    #[test]
    fn hf_download_failure_is_reported() {
        let (_t, mut env) = scratch_env("hf-dlfail");
        env.hf_offline = false;
        env.offline = false;
        // nothing listens there: refused at once, no hang
        env.hf_endpoint = format!("http://{}", closed_port());
        let started = std::time::Instant::now();
        let m = message(resolve_with("hf:o/r/f.gguf", &env));
        assert!(m.contains("not in the Hugging Face cache"), "{m}");
        assert!(m.contains("the download failed"), "{m}");
        assert!(m.contains(&format!("downloading {}/o/r/resolve/main/f.gguf failed", env.hf_endpoint)), "{m}");
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "{:?}", started.elapsed());
        let m = message(resolve_with("hf:o/r", &env));
        assert!(m.contains("complete checkpoint") && m.contains("config.json failed"), "{m}");
    }

    #[test]
    fn hf_download_into_cache_layout() {
        let t = scratch("hf-dl");
        let hub = FakeHub::start();
        let mut env = env_in(&t.0);
        env.hf_offline = false;
        env.offline = false;
        env.hf_endpoint = hub.endpoint.clone();
        env.hf_token = Some("hf_secret".into());
        let p = resolve_with("hf:org/repo/dir/w.gguf", &env).unwrap();
        let repo = env.hf_hub.clone().unwrap().join("models--org--repo");
        let commit = FakeHub::COMMIT;
        assert_eq!(p, repo.join("snapshots").join(commit).join("dir/w.gguf"));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "/org/repo/resolve/main/dir/w.gguf");
        assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), commit);
        // the file is a link into blobs/, as huggingface_hub lays it out
        assert!(std::fs::symlink_metadata(&p).unwrap().file_type().is_symlink() || !cfg!(unix));
        assert!(repo.join("blobs").read_dir().unwrap().count() >= 1);
        assert!(hub.requests().iter().all(|r| r.contains("authorization: Bearer hf_secret")), "{:?}", hub.requests());
        // a second file lands in the same snapshot
        let p = resolve_with("hf:org/repo/x.bin", &env).unwrap();
        assert_eq!(p, repo.join("snapshots").join(commit).join("x.bin"));
        // now offline, both come from the cache without a request
        env.hf_offline = true;
        let before = hub.requests().len();
        assert!(resolve_with("hf:org/repo/dir/w.gguf", &env).is_ok());
        assert!(resolve_with("hf:org/repo/x.bin", &env).is_ok());
        assert_eq!(hub.requests().len(), before);
        // failures carry the status and leave no partial files
        env.hf_offline = false;
        let m = message(resolve_with("hf:org/repo/missing.gguf", &env));
        assert!(m.contains("404"), "{m}");
        let partial: Vec<_> = std::fs::read_dir(repo.join("blobs"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".part"))
            .collect();
        assert!(partial.is_empty(), "{partial:?}");
        // a whole checkpoint (the index 404s, the single file is there)
        let snap = resolve_with("hf:org/ckpt", &env).unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            assert!(snap.join(f).is_file(), "{f}");
        }
        assert_eq!(resolve_with("hf:org/ckpt", &env).unwrap(), snap);
    }
}
