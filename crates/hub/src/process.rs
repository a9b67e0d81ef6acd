//! Child processes (pip, python) whose progress the user sees, and
//! scratch folders that clean up after a failed download.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// Removes a scratch directory when dropped.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl TempDir {
    /// An empty scratch folder `name` inside `parent` (created if needed),
    /// so that a download lands on the same file system as its destination
    /// and can be moved there in one rename.
    pub fn empty_in(parent: &Path, name: &str) -> Result<Self, String> {
        std::fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        let tmp = TempDir(parent.join(name));
        let _ = std::fs::remove_dir_all(&tmp.0);
        std::fs::create_dir_all(&tmp.0).map_err(|e| format!("cannot create {}: {e}", tmp.0.display()))?;
        Ok(tmp)
    }
}

/// Runs `cmd` (see [`run_teed`]) and turns "could not start" and "exited
/// with failure" into the messages `cannot_run` and `failed` make from the
/// I/O error and from the status with the output's last lines.
pub fn run_checked(
    cmd: &mut Command,
    cannot_run: impl FnOnce(std::io::Error) -> String,
    failed: impl FnOnce(ExitStatus, String) -> String,
) -> Result<(), String> {
    let (status, tail) = run_teed(cmd).map_err(cannot_run)?;
    if status.success() {
        Ok(())
    } else {
        Err(failed(status, tail))
    }
}

/// Runs a command, copying its stdout and stderr to our stderr as they
/// come (progress), and returns its status with the last lines of output.
pub fn run_teed(cmd: &mut Command) -> std::io::Result<(ExitStatus, String)> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
    let mut child = cmd.spawn()?;
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
