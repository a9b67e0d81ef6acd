//! Helpers shared by the unit tests: scratch folders, an environment that
//! can never reach the network, and stand-in executables.

use crate::process::TempDir;
use crate::{Env, Result};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A fresh temporary folder, removed on drop.
pub fn scratch(name: &str) -> TempDir {
    let p = std::env::temp_dir().join(format!(
        "kvslim-resolve-{name}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    TempDir(p)
}

/// A fresh scratch folder `name` and an environment inside it that can
/// never reach the network (see [`env_in`]).
pub fn scratch_env(name: &str) -> (TempDir, Env) {
    let t = scratch(name);
    let env = env_in(&t.0);
    (t, env)
}

/// [`scratch_env`] allowed to fetch (its python is a path that does not
/// exist until a test writes one; Hugging Face stays offline).
pub fn online_env(name: &str) -> (TempDir, Env) {
    let (t, mut env) = scratch_env(name);
    env.offline = false;
    (t, env)
}

/// An environment that can never reach the network.
pub fn env_in(root: &Path) -> Env {
    Env {
        kvslim_models: vec![root.join("models")],
        user_cache: Some(root.join("cache/kvslim/models")),
        hf_hub: Some(root.join("hf/hub")),
        hf_endpoint: format!("http://{}", closed_port()),
        hf_token: None,
        hf_offline: true,
        offline: true,
        home: Some(root.join("home")),
        python: root.join("no-such-python").into(),
    }
}

pub fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// Writes an executable shell script (a stand-in for python3). A child
/// process writes it: a file this process held open for writing could be
/// inherited by a child that another test thread forks at that moment, and
/// executing the script while that child lives fails with ETXTBSY ("Text
/// file busy").
#[cfg(unix)]
pub fn write_script(path: &Path, text: &str) -> PathBuf {
    use std::process::{Command, Stdio};
    let mut sh = Command::new("sh")
        .args(["-c", "cat > \"$0\" && chmod 755 \"$0\""])
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    sh.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    assert!(sh.wait().unwrap().success(), "writing {}", path.display());
    path.to_path_buf()
}

pub fn message(r: Result<PathBuf>) -> String {
    r.expect_err("expected an error").to_string()
}

/// A loopback address where nothing listens (a port bound, then released).
pub fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// A stand-in for the Hugging Face hub on a loopback port: every
/// `/org/repo/resolve/main/FILE` answers with its own path as the body,
/// the `X-Repo-Commit`, `ETag` and `Content-Range` headers the hub sends
/// and honours `Range`; files named `*missing*` and sharded-checkpoint
/// indexes are 404. Each request's head is recorded (header names in
/// lower case).
pub struct FakeHub {
    pub endpoint: String,
    requests: Arc<Mutex<Vec<String>>>,
}

impl FakeHub {
    pub const COMMIT: &'static str = "1111111111111111111111111111111111111111";

    pub fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", l.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut s) = conn else { return };
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut head = Vec::new();
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    let l = line.trim_end();
                    head.push(match l.split_once(':') {
                        Some((k, v)) => format!("{}:{v}", k.to_ascii_lowercase()),
                        None => l.to_string(),
                    });
                    line.clear();
                }
                let path = head.first().and_then(|l| l.split(' ').nth(1)).unwrap_or("").to_string();
                let range_from = head
                    .iter()
                    .find_map(|h| h.strip_prefix("range: bytes="))
                    .and_then(|r| r.split('-').next())
                    .and_then(|v| v.parse::<usize>().ok());
                log.lock().unwrap().push(head.join("\n"));
                let body = path.as_bytes();
                let reply = if path.contains("missing") || path.ends_with("model.safetensors.index.json") {
                    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".as_bytes().to_vec()
                } else {
                    let from = range_from.unwrap_or(0).min(body.len());
                    let to = if head.iter().any(|h| h == "range: bytes=0-0") { 1 } else { body.len() };
                    let part = &body[from..to.max(from)];
                    let mut out = format!(
                        "HTTP/1.1 206 Partial Content\r\nX-Repo-Commit: {}\r\nETag: \"{:016x}\"\r\n\
                         Content-Range: bytes {from}-{}/{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        Self::COMMIT,
                        path.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3)),
                        (from + part.len()).max(1) - 1,
                        body.len(),
                        part.len()
                    )
                    .into_bytes();
                    out.extend_from_slice(part);
                    out
                };
                let _ = s.write_all(&reply);
            }
        });
        FakeHub { endpoint, requests }
    }

    /// The heads of the requests received so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}
