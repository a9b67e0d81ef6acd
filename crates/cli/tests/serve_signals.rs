//! `kvslim serve` as a process: SIGTERM while a stream runs lets the stream
//! finish and the process exit 0; the API key from the environment.

use kvslim_loadtest::http_client;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../../testing/shared_dir.rs"]
mod shared_dir;
use shared_dir::shared;

/// Starts `kvslim serve` on a free port; returns the child (stderr drained
/// by a thread into the returned log) and its address.
fn serve(extra: &[&str], env: &[(&str, &str)]) -> (Child, String, std::sync::Arc<std::sync::Mutex<String>>) {
    let model = shared().join("models/stories260K/stories260K.bin");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvslim"))
        .args(["serve", "--model", model.to_str().unwrap(), "--port", "0"])
        .args(extra)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kvslim serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let addr = loop {
        let line = lines.next().expect("kvslim serve exited before listening").unwrap();
        log.lock().unwrap().push_str(&format!("{line}\n"));
        if let Some(rest) = line.strip_prefix("kvslim serve: http://") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let l = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            l.lock().unwrap().push_str(&format!("{line}\n"));
        }
    });
    (child, addr, log)
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill").args([sig, &child.id().to_string()]).status().expect("run kill").success();
    assert!(ok, "kill {sig} failed");
}

fn wait(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t.elapsed() > within {
            let _ = child.kill();
            panic!("kvslim serve did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_lets_a_running_stream_finish_then_exits_0() {
    let (mut child, addr, log) = serve(&["--grace-period", "20"], &[]);
    // 8 choices × 400 tokens: a stream that runs for a while
    let body = json!({"prompt": "Once upon a time", "max_tokens": 400, "n": 8, "temperature": 0, "stream": true});
    let mut s =
        http_client::open(&addr, "POST", "/v1/completions", Some(&body.to_string()), Duration::from_secs(60)).unwrap();
    assert_eq!(s.status, 200);
    let first = s.next_event().unwrap().expect("a first chunk");
    assert!(first.contains("text_completion"), "{first}");
    signal(&child, "-TERM");
    let mut finished = 0;
    let mut done = false;
    while let Some(d) = s.next_event().unwrap() {
        if d == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = serde_json::from_str(&d).unwrap();
        assert!(v.get("error").is_none(), "the stream must not be cut: {v}");
        if !v["choices"][0]["finish_reason"].is_null() {
            finished += 1;
        }
    }
    assert!(done, "stream ended without [DONE]");
    assert_eq!(finished, 8, "every choice finishes");
    let status = wait(&mut child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "log:\n{}", log.lock().unwrap());
    let log = log.lock().unwrap();
    assert!(log.contains("draining"), "{log}");
}

#[test]
fn sigterm_when_idle_exits_0_and_api_key_comes_from_the_environment() {
    let (mut child, addr, _) = serve(&[], &[("KVSLIM_API_KEY", "k-123")]);
    let r = http_client::request(&addr, "GET", "/v1/models", None).unwrap();
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    assert_eq!(http_client::request(&addr, "GET", "/health", None).unwrap().status, 200);
    signal(&child, "-INT");
    assert_eq!(wait(&mut child, Duration::from_secs(10)).code(), Some(0));
}
