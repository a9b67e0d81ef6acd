//! Pieces every subcommand shares: model/tokenizer loading, thread setup,
//! progress display.

use clap::Args;
use kvslim_cache::PolicySpec;
use kvslim_engine::{EngineError, Setting};
use kvslim_models::chat::{ChatError, ChatFormat};
use kvslim_models::{LoadedModel, Tokenizer};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub type CliResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// A command's error as the user reads it: an engine or evaluation
/// setting it blames is written as the flag that sets it.
pub fn message(e: &(dyn std::error::Error + 'static)) -> String {
    let engine = match e.downcast_ref::<kvslim_eval::EvalError>() {
        Some(kvslim_eval::EvalError::Setting(s)) => return s.message(eval_flag(s.setting), " "),
        Some(kvslim_eval::EvalError::Engine(x)) => Some(x),
        _ => e.downcast_ref::<EngineError>(),
    };
    match engine {
        Some(EngineError::Setting(s)) => s.message(flag(s.setting)),
        _ => e.to_string(),
    }
}

/// The flag of an evaluation setting.
fn eval_flag(s: kvslim_eval::Setting) -> &'static str {
    use kvslim_eval::Setting;
    match s {
        Setting::SeqLen => "--seq-len",
        Setting::SkipTokens => "--skip-tokens",
        Setting::OutDir => "--out",
        Setting::Replace => "--replace",
        Setting::Resume => "--resume",
    }
}

/// The flag of an engine setting.
fn flag(s: Setting) -> &'static str {
    match s {
        Setting::Prefill => "--prefill",
        Setting::CompareFull => "--compare-full",
        Setting::DecisionsFrom => "--decisions-from",
        Setting::MaxTokens => "--max-tokens",
        Setting::Temperature => "--temperature",
        Setting::MaxKl => "--max-kl",
    }
}

/// `--policy`: the KV cache policy of a command that runs one (`bench`
/// takes several to compare, so it declares its own list).
#[derive(Args, Clone, Debug)]
pub struct PolicyArgs {
    /// KV cache policy (see docs/policies.md; for `serve`, the default of
    /// requests without `kv_policy`), with optional storage keys: `page=P`
    /// (paged KV, pages of P tokens), `compact=N` (repack pages every N
    /// decode steps), `page_score=sum|max|topm:M` (evict whole pages),
    /// `kv_dtype=f32|f16|q8|q4` (K/V storage type), e.g.
    /// `h2o:heavy=64,recent=64,page=16,compact=64,kv_dtype=q8` or
    /// `full:kv_dtype=q8`. `auto:budget=P%` picks the variant measured best
    /// for this model at the nearest measured share among those costing one
    /// prefill (`kvslim info` shows what it resolves to); for a context
    /// compressed once and asked many questions, name the KVzip-style
    /// prefill with KVzip's budget, e.g.
    /// `h2o:heavy=21.875%,recent=3.125%,prefill=kvzip,alloc=global` (one
    /// more pass over the prompt, in pieces), or the learned
    /// `prefill=kvzap` (no extra pass; a predictor file from `kvslim
    /// calibrate --kvzap`). In `perplexity`, paged specs also report
    /// pages, KV bytes, fragmentation and bytes moved per decode step.
    #[arg(long = "policy", value_name = "POLICY", default_value = "full", value_parser = PolicySpec::parse_and_load)]
    pub spec: PolicySpec,
}

/// `--prompt` or `--prompt-file` (one of them): the text a run starts from.
/// A command that calls it something else words the help with `mut_arg`
/// (`compress`: the document).
#[derive(Args)]
pub struct PromptArgs {
    /// The prompt text.
    #[arg(long, short = 'p', required_unless_present = "prompt_file", conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    /// Read the prompt from this file (kept byte for byte: a trailing
    /// newline is part of the prompt), e.g. a chat-formatted prompt.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
}

impl PromptArgs {
    /// The text of `--prompt` or else of `--prompt-file` (read byte for byte).
    pub fn read(&self) -> CliResult<String> {
        match (&self.prompt, &self.prompt_file) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(f)) => Ok(std::fs::read_to_string(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?),
            (None, None) => Err("give --prompt or --prompt-file".into()),
        }
    }
}

/// `--text`: the calibration text of `calibrate` and `tune` (`tune` words
/// the help for how it cuts windows from it).
#[derive(Args)]
pub struct CalibrationText {
    /// Calibration text (tokenized with the model's tokenizer).
    #[arg(id = "text", long = "text", value_name = "TEXT")]
    pub path: PathBuf,
}

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
    /// or an alias (`smollm2-135m`, `gemma3-270m`, `qwen2.5-coder-1.5b`, `qwen2.5-coder-0.5b`, `stories260k`; see `kvslim fetch --help`).
    #[arg(long, short = 'm', default_value = "smollm2-135m")]
    pub model: String,
    /// Tokenizer file (tokenizer.json or llama2.c tokenizer.bin) when the
    /// model does not carry one.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Multiply quantized weights (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0,
    /// Q4_K/Q5_K/Q6_K) with f32 activations, so results equal the
    /// dequantized model's to f32 rounding. By default (on CPUs with AVX-512
    /// VNNI) activations are quantized to 8 bits per block of 32 and the
    /// products are integer sums, as llama.cpp does: about twice as fast, at
    /// a small cost in accuracy (WikiText-2 perplexity over 1,024 tokens:
    /// SmolLM2-135M Q4_1 13.65 → 13.77, Gemma 3 270M Q4_K_M 10.17 → 10.19).
    /// `KVSLIM_INT8=0` does the same for every command and library user.
    #[arg(long)]
    pub f32_activations: bool,
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
        if self.f32_activations {
            loaded.model.weights.set_products(kvslim_kernels::Products::F32);
        }
        if let Some(t) = &self.tokenizer {
            let c = &loaded.model.config;
            loaded.tokenizer = Some(kvslim_models::loader::load_tokenizer(t, c.bos_token_id, c.eos_token_ids.clone())?);
            kvslim_models::loader::set_repeat_prompt(&mut loaded);
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

/// Configures rayon's global pool once (later calls change nothing: `main`
/// sets it up before the command loads its model).
pub fn init_threads(threads: Option<usize>) -> CliResult {
    static DONE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if let Some(n) = threads {
        if n == 0 {
            return Err("--threads must be at least 1".into());
        }
        if DONE.get().is_none() {
            rayon::ThreadPoolBuilder::new().num_threads(n).build_global()?;
            let _ = DONE.set(());
        }
    }
    Ok(())
}

/// A progress bar on stderr (`indicatif`) when stderr is a terminal;
/// otherwise (logs, `nohup`, CI) a plain line at most once a minute, so a
/// long run in the background still says how far it is. One `Progress`
/// can follow several runs in a row (the eval matrix's cells): a count
/// that starts over or a new total begins a new bar. A run that begins
/// part-way (a resumed cell) takes its rate from what it counts itself,
/// not from the items done before it started.
pub struct Progress {
    label: &'static str,
    unit: &'static str,
    bar: Option<indicatif::ProgressBar>,
    /// Without a terminal: when the current run began and the last line was printed.
    started: Instant,
    last_line: Instant,
    /// The count the current run began at (non-zero when it resumed).
    first: u64,
}

/// Seconds between the plain progress lines written when stderr is not a terminal.
const LINE_EVERY_S: u64 = 60;

impl Progress {
    /// `unit` names what is counted (`tok`, `items`, `windows`).
    pub fn new(label: &'static str, unit: &'static str) -> Self {
        let now = Instant::now();
        Progress { label, unit, bar: None, started: now, last_line: now, first: 0 }
    }

    /// Shows `done/total` with the rate and the time left.
    pub fn update(&mut self, done: usize, total: usize) {
        let (done, total) = (done as u64, total as u64);
        let stale =
            self.bar.as_ref().is_none_or(|b| b.is_finished() || b.length() != Some(total) || b.position() > done);
        let terminal = std::io::stderr().is_terminal();
        if stale {
            let target = if terminal {
                indicatif::ProgressDrawTarget::stderr()
            } else {
                indicatif::ProgressDrawTarget::hidden()
            };
            let bar = indicatif::ProgressBar::with_draw_target(Some(total), target);
            let template =
                format!("{{prefix}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{per_sec}} ETA {{eta}}", unit = self.unit);
            if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
                bar.set_style(style.progress_chars("#>-"));
            }
            bar.set_prefix(self.label);
            // a resumed run starts part-way: its rate counts from here
            bar.set_position(done);
            bar.reset_eta();
            self.bar = Some(bar);
            self.started = Instant::now();
            self.last_line = self.started;
            self.first = done;
        }
        if !terminal && self.last_line.elapsed().as_secs() >= LINE_EVERY_S {
            self.last_line = Instant::now();
            let spent = self.started.elapsed().as_secs_f64();
            let left = seconds_left(spent, done.saturating_sub(self.first), total.saturating_sub(done));
            eprintln!(
                "{}: {done}/{total} {} ({:.0}%), {:.1} min so far, about {:.1} min left",
                self.label,
                self.unit,
                100.0 * done as f64 / total.max(1) as f64,
                spent / 60.0,
                left / 60.0
            );
        }
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            if done >= total {
                bar.finish();
            }
        }
    }
}

/// Time left at the rate of this run: `spent` seconds for `counted` items,
/// `remaining` to go (NaN before the first item is counted).
fn seconds_left(spent: f64, counted: u64, remaining: u64) -> f64 {
    if counted == 0 {
        return f64::NAN;
    }
    spent / counted as f64 * remaining as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_counts_only_this_runs_items() {
        // resumed at 3,000 of 10,000, 100 items in 50 s: 6,900 left at 2/s
        assert_eq!(seconds_left(50.0, 3_100 - 3_000, 10_000 - 3_100), 3_450.0);
        assert!(seconds_left(5.0, 0, 10).is_nan());
        let mut p = Progress::new("t", "items");
        p.update(3_000, 10_000);
        assert_eq!(p.first, 3_000);
        p.update(3_016, 10_000);
        assert_eq!(p.first, 3_000, "a growing count continues the run");
        p.update(0, 7);
        assert_eq!(p.first, 0, "a new total starts a new run");
    }

    #[test]
    fn evaluation_settings_are_written_as_flags() {
        let w = |start, end| kvslim_eval::tune::TextWindows {
            path: "t.txt".into(),
            seq_len: 4,
            token_range: (start, end),
            text_tokens: 100,
            windows_sha256: String::new(),
            windows: Vec::new(),
        };
        let e = kvslim_eval::tune::check_disjoint(&w(50, 80), &w(0, 51)).unwrap_err();
        assert!(e.to_string().contains("(skip=51)"), "{e}");
        let m = message(&e);
        assert!(m.contains("overlap") && m.contains("(--skip-tokens 51) or evaluate fewer windows"), "{m}");
    }
}
