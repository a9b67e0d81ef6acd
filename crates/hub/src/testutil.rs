//! Helpers shared by the unit tests: scratch folders, an environment that
//! can never reach the network, and stand-in executables.

use crate::process::TempDir;
use crate::{Env, Result};
use std::path::{Path, PathBuf};

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

/// An environment that can never reach the network.
pub fn env_in(root: &Path) -> Env {
    Env {
        kvslim_models: vec![root.join("models")],
        user_cache: Some(root.join("cache/kvslim/models")),
        hf_hub: Some(root.join("hf/hub")),
        hf_endpoint: "http://127.0.0.1:9".into(),
        hf_token: None,
        hf_offline: true,
        offline: true,
        home: Some(root.join("home")),
        curl: root.join("no-such-curl").into(),
        python: root.join("no-such-python").into(),
    }
}

pub fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// Writes an executable shell script (a stand-in for python3 or curl).
#[cfg(unix)]
pub fn write_script(path: &Path, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    write(path, text.as_bytes());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_path_buf()
}

pub fn message(r: Result<PathBuf>) -> String {
    r.expect_err("expected an error").to_string()
}
