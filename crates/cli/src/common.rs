//! Pieces every subcommand shares: model/tokenizer loading, thread setup,
//! progress display.

use clap::Args;
use kvslim_models::chat::{ChatError, ChatFormat};
use kvslim_models::{LoadedModel, Tokenizer};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

pub type CliResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// `--temperature`, `--top-k`, `--top-p`, `--seed`: how tokens are drawn.
#[derive(Args, Clone, Copy, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// RNG seed for sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    pub fn params(&self) -> kvslim_engine::SamplingParams {
        kvslim_engine::SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        }
    }
}

/// `--model`, `--tokenizer`, `--threads`.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model: a path (HF directory, .gguf, llama2.c .bin), `hf:org/repo[/file]`,
    /// or an alias (`smollm2-135m`, `stories260k`).
    #[arg(long, short = 'm', default_value = "smollm2-135m")]
    pub model: String,
    /// Tokenizer file (tokenizer.json or llama2.c tokenizer.bin) when the
    /// model does not carry one.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

impl ModelArgs {
    /// Sets up threads, resolves the spec and loads model + tokenizer.
    pub fn load(&self) -> CliResult<LoadedModel> {
        Ok(self.load_with_path()?.0)
    }

    /// [`ModelArgs::load`], also returning the resolved model path.
    pub fn load_with_path(&self) -> CliResult<(LoadedModel, PathBuf)> {
        init_threads(self.threads)?;
        let path = kvslim_hub::resolve_model(&self.model)?;
        let mut loaded = kvslim_models::load_model(&path)?;
        if let Some(t) = &self.tokenizer {
            let c = &loaded.model.config;
            loaded.tokenizer = Some(kvslim_models::loader::load_tokenizer(t, c.bos_token_id, c.eos_token_ids.clone())?);
        }
        Ok((loaded, path))
    }

    /// The chat format of the loaded tokenizer: its template, with the
    /// BOS/EOS strings of the `tokenizer_config.json` beside `tokenizer.json`
    /// (HF models) and errors that name the file; the plain fallback when
    /// the model has no template.
    pub fn chat_format(&self, tok: &Tokenizer, model_path: &Path) -> Result<ChatFormat, ChatError> {
        let dir = match &self.tokenizer {
            Some(t) => t.parent().map(Path::to_path_buf),
            None if model_path.is_dir() => Some(model_path.to_path_buf()),
            None => None,
        };
        let config = dir.map(|d| d.join("tokenizer_config.json")).filter(|p| p.exists());
        ChatFormat::for_tokenizer(tok, config.as_deref(), &model_path.display().to_string())
    }
}

/// The loaded tokenizer, or an error telling the user how to supply one.
pub fn require_tokenizer(t: &Option<Tokenizer>) -> CliResult<&Tokenizer> {
    t.as_ref().ok_or_else(|| "this model has no tokenizer; pass --tokenizer PATH".into())
}

/// Configures rayon's global pool once.
pub fn init_threads(threads: Option<usize>) -> CliResult {
    if let Some(n) = threads {
        if n == 0 {
            return Err("--threads must be at least 1".into());
        }
        rayon::ThreadPoolBuilder::new().num_threads(n).build_global()?;
    }
    Ok(())
}

/// A one-line progress display on stderr (only when stderr is a terminal).
pub struct Progress {
    label: &'static str,
    start: std::time::Instant,
    enabled: bool,
    last: std::time::Instant,
}

impl Progress {
    pub fn new(label: &'static str) -> Self {
        let now = std::time::Instant::now();
        Progress { label, start: now, enabled: std::io::stderr().is_terminal(), last: now }
    }

    /// Shows `done/total` with rate and ETA, at most 10 times per second.
    pub fn update(&mut self, done: usize, total: usize) {
        if !self.enabled || (self.last.elapsed().as_millis() < 100 && done < total) {
            return;
        }
        self.last = std::time::Instant::now();
        let secs = self.start.elapsed().as_secs_f64();
        let rate = done as f64 / secs.max(1e-9);
        let eta = (total - done) as f64 / rate.max(1e-9);
        let width = 30;
        let filled = (done * width) / total.max(1);
        eprint!(
            "\r{} [{}{}] {done}/{total} {rate:.1} tok/s ETA {eta:.0}s ",
            self.label,
            "#".repeat(filled),
            " ".repeat(width - filled)
        );
        if done >= total {
            eprintln!();
        }
        let _ = std::io::stderr().flush();
    }
}
