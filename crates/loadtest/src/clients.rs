//! What a load run ([`crate::load`]) and a soak ([`crate::soak`]) share:
//! the server they load and the clients that load it.

use std::path::PathBuf;

/// The server under load and the clients that load it.
#[derive(Clone, Debug)]
pub struct Clients {
    /// `host:port` of the server.
    pub addr: String,
    /// Sent as `Authorization: Bearer …` when the server wants one.
    pub api_key: Option<String>,
    /// The server's process, for its resident memory (Linux
    /// `/proc/PID/status`); `None`: not reported.
    pub server_pid: Option<u32>,
    /// Concurrent clients.
    pub count: usize,
    /// Tokens per (well-formed) request.
    pub max_tokens: usize,
    /// A text to cut the prompts from, each `prompt_tokens` tokens long by
    /// the server's tokenizer ([`crate::prompts`]); `None`: the run's own
    /// prompts.
    pub prompt_file: Option<PathBuf>,
    /// Tokens per prompt cut from `prompt_file`.
    pub prompt_tokens: Option<usize>,
}

impl Clients {
    /// The `Authorization` header's value, when there is a key.
    pub fn auth(&self) -> Option<String> {
        self.api_key.as_ref().map(|k| format!("Bearer {k}"))
    }
}
