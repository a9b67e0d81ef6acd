//! SHA-256 checks of downloaded and cached model files, with a note beside
//! each verified file so that an unchanged file is hashed only once.

use std::io::Read;
use std::path::{Path, PathBuf};

/// The checksum a `SHA256SUMS` file (`<hex>  <name>` lines, `*<name>` for
/// binary mode) lists for `file`.
pub fn package_checksum(sums: &Path, file: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(sums).map_err(|e| format!("cannot read {}: {e}", sums.display()))?;
    text.lines()
        .filter_map(|l| l.split_once(char::is_whitespace))
        .find(|(_, name)| name.trim().trim_start_matches('*') == file)
        .map(|(hex, _)| hex.trim().to_string())
        .filter(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| format!("{} has no SHA-256 line for {file}", sums.display()))
}

/// The SHA-256 of a file, lower-case hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
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
pub fn sha256_note(path: &Path) -> Option<PathBuf> {
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
pub fn verify_sha256(path: &Path, expected: &str) -> Result<(), String> {
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
pub fn write_sha256_note(path: &Path, sha: &str) {
    let line = std::fs::metadata(path).ok().and_then(|m| note_line(&m, sha));
    if let (Some(note), Some(line)) = (sha256_note(path), line) {
        let _ = std::fs::write(note, line);
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::alias::GEMMA3;
    use crate::testutil::{scratch, write};

    /// SHA-256 of `abc` (FIPS 180-2 test vector).
    pub const ABC_SHA256: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn sha256_matches_the_standard_vector() {
        let t = scratch("sha");
        let f = t.0.join("abc");
        write(&f, b"abc");
        assert_eq!(sha256_file(&f).unwrap(), ABC_SHA256);
        assert!(verify_sha256(&f, &ABC_SHA256.to_ascii_uppercase()).is_ok());
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
}
