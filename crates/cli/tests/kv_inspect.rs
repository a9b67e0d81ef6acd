//! `POST /v1/kv/inspect` on a running `kvslim serve` gives exactly the kept
//! sets `kvslim perplexity --text FILE --policy SPEC --kept-out K` writes for
//! the same text: token eviction (fixed slots and a prefill chunk), paged
//! policies (page eviction, compaction), CHAI alone and composed with H2O,
//! and a model with sliding-window layers (Gemma 3 270M, window 512, on a
//! text longer than the window).

use kvslim_loadtest::http_client;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

#[path = "../../../testing/shared_dir.rs"]
mod shared_dir;
use shared_dir::shared;

fn kvslim(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_kvslim")).args(args).output().expect("run kvslim");
    assert!(o.status.success(), "kvslim {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    o
}

/// A `kvslim serve` child, killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(model: &str) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvslim"))
        .args(["serve", "--model", model, "--port", "0", "--kv-memory", "4GiB"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kvslim serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("kvslim serve exited before listening").unwrap();
        if let Some(rest) = line.strip_prefix("kvslim serve: http://") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
    Server { child, addr }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvslim-inspect-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The first `chars` characters of TinyStories' validation text.
fn story(chars: usize) -> String {
    let t = std::fs::read_to_string(shared().join("data/tinystories/tinystories_val.txt")).unwrap();
    t.chars().take(chars).collect()
}

/// Runs both on `text` and asserts the kept sets (and token ids, KV bytes) agree.
fn compare(server: &Server, model: &str, dir: &Path, text: &str, spec: &str, prefill: usize) {
    let file = dir.join("text.txt");
    std::fs::write(&file, text).unwrap();
    let kept_file = dir.join("kept.json");
    let o = kvslim(&[
        "perplexity",
        "--model",
        model,
        "--text",
        file.to_str().unwrap(),
        "--policy",
        spec,
        "--prefill",
        &prefill.to_string(),
        "--kept-out",
        kept_file.to_str().unwrap(),
        "--json",
        "--per-token",
    ]);
    let cli: Value = serde_json::from_slice(&o.stdout).unwrap();
    let want: Value = serde_json::from_str(&std::fs::read_to_string(&kept_file).unwrap()).unwrap();
    let body = json!({"prompt": text, "kv_policy": spec, "prefill": prefill}).to_string();
    let r = http_client::request(&server.addr, "POST", "/v1/kv/inspect", Some(&body)).unwrap();
    assert_eq!(r.status, 200, "{spec}: {}", r.text());
    let got = r.json();
    assert_eq!(got["token_ids"], cli["token_ids"], "{spec}: same tokenization");
    assert_eq!(got["kept"], want, "{spec} prefill {prefill}: kept sets");
    assert_eq!(got["kv_bytes"], cli["kv_bytes_allocated"], "{spec}");
    let layers = want["layers"].as_array().unwrap();
    assert!(!layers.is_empty() && layers.iter().all(|l| !l["kv_heads"].as_array().unwrap().is_empty()));
}

#[test]
fn kept_sets_equal_perplexity_kept_out_on_stories260k() {
    let model = shared().join("models/stories260K/stories260K.bin").display().to_string();
    let dir = temp_dir("stories");
    let plan = dir.join("plan.json");
    let text = shared().join("data/tinystories/tinystories_val.txt").display().to_string();
    let calibrate = ["calibrate", "--model", &model, "--text", &text, "--samples", "16", "--seq-len", "32", "--out"];
    kvslim(&[&calibrate[..], &[plan.to_str().unwrap()]].concat());
    let chai = format!("chai:plan={}", plan.display());
    let h2o_chai = format!("h2o:heavy=16,recent=16+{chai}");
    let server = serve(&model);
    let t = story(700);
    for (spec, prefill) in [
        ("h2o:heavy=16,recent=16", 0),
        ("h2o:heavy=16,recent=16", 64),
        ("sink:sink=4,recent=28", 0),
        ("h2o:heavy=16,recent=16,page=8,page_score=sum", 0),
        ("h2o:heavy=16,recent=16,page=8,compact=16", 32),
        ("full", 0),
        (chai.as_str(), 0),
        (h2o_chai.as_str(), 48),
    ] {
        compare(&server, &model, &dir, &t, spec, prefill);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Gemma 3's local layers keep at most their window of 512: a text longer
/// than it, prefilled, then decoded past it.
#[test]
fn kept_sets_equal_perplexity_kept_out_on_a_sliding_window_model() {
    let model = "gemma3-270m";
    let dir = temp_dir("gemma");
    let server = serve(model);
    let t = story(2600);
    let body = json!({"prompt": t}).to_string();
    let n = http_client::request(&server.addr, "POST", "/tokenize", Some(&body)).unwrap().json()["count"]
        .as_u64()
        .unwrap() as usize;
    assert!(n > 540, "the text must outgrow the 512-token window: {n} tokens");
    for spec in ["full", "h2o:heavy=32,recent=32"] {
        compare(&server, model, &dir, &t, spec, n - 24);
    }
    std::fs::remove_dir_all(&dir).ok();
}
