//! Helpers shared by the tests of the `kvslim` binary.
#![allow(dead_code)] // each test crate uses its own subset

use std::io::Write;
use std::process::{Command, Output, Stdio};

#[path = "../../../../testing/shared_dir.rs"]
mod shared_dir;
pub use shared_dir::shared;

/// The stories260K model file.
pub fn stories() -> String {
    shared().join("models/stories260K/stories260K.bin").display().to_string()
}

/// The TinyStories validation text.
pub fn stories_text() -> String {
    shared().join("data/tinystories/tinystories_val.txt").display().to_string()
}

pub fn kvslim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvslim")).args(args).output().expect("run kvslim")
}

/// `kvslim` with `input` on its standard input.
pub fn kvslim_with_stdin(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvslim"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kvslim");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// The JSON a successful run printed.
pub fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "kvslim failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

/// `kvslim perplexity` of `model` on the first `max_tokens` tokens of
/// `text`, then `extra`.
pub fn perplexity_args<'a>(model: &'a str, text: &'a str, max_tokens: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["perplexity", "--model", model, "--text", text, "--max-tokens", max_tokens];
    a.extend_from_slice(extra);
    a
}
