//! `kvslim`: run, measure and serve LLMs with a compressed KV cache.

mod bench;
mod calibrate;
mod chat;
mod common;
mod compress;
mod draft;
mod eval;
mod fetch;
mod generate;
mod info;
mod loadtest;
mod perplexity;
mod serve;
mod tune;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "kvslim",
    version,
    about = "CPU LLM inference with a compressed KV cache (H2O, CHAI) and the tools to measure it",
    long_about = "CPU LLM inference with a compressed KV cache (H2O, CHAI) and the tools to measure it.\n\n\
Models: a Hugging Face directory (config.json + safetensors), a .gguf file, a llama2.c .bin, \
`hf:org/repo[/file]`, or an alias (`smollm2-135m`, the default; `gemma3-270m`; `qwen2.5-coder-1.5b`; `qwen2.5-coder-0.5b`; `stories260k`): `kvslim fetch --help` lists them."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a model's configuration, parameter count and sizes.
    Info(info::Args),
    /// Generate text from a prompt, streaming it to the terminal.
    Generate(generate::Args),
    /// Compress a document once under a policy and save it (`generate --context`, `chat --context` ask it).
    Compress(compress::Args),
    /// Interactive multi-turn chat through the model's own chat template.
    Chat(chat::Args),
    /// Teacher-forced perplexity of a text or token list.
    Perplexity(perplexity::Args),
    /// Measure prefill and decode speed against the memory-bandwidth bound.
    Bench(bench::Args),
    /// Evaluate policies × budgets × tasks; results.jsonl/csv/md and plots.
    Eval(eval::Args),
    /// CHAI offline calibration: per-layer error curves, elbow k, static membership → plan.json.
    Calibrate(calibrate::Args),
    /// Search policies × score families on calibration text at a budget (or a KL target); write the best spec.
    Tune(tune::Args),
    /// OpenAI-compatible HTTP server with continuous batching and per-request KV policies.
    Serve(serve::Args),
    /// Load-test a running server with concurrent streaming clients.
    Loadtest(loadtest::Args),
    /// Resolve a model (alias, hf:, path), downloading it if needed; print its path.
    Fetch(fetch::Args),
}

impl Command {
    /// `--threads` of a command that runs the model on the calling thread,
    /// which then runs on a worker of rayon's pool
    /// ([`kvslim_engine::on_workers`]); `None` for the others (the server
    /// runs its scheduler on a worker itself, `bench` builds its own pools).
    fn model_threads(&self) -> Option<Option<usize>> {
        match self {
            Command::Info(a) => Some(a.model.threads),
            Command::Generate(a) => Some(a.model.threads),
            Command::Chat(a) => Some(a.model.threads),
            Command::Compress(a) => Some(a.model.threads),
            Command::Perplexity(a) => Some(a.model.threads),
            Command::Eval(a) => Some(a.model.threads),
            Command::Calibrate(a) => Some(a.model.threads),
            Command::Tune(a) => Some(a.model.threads),
            Command::Serve(_) | Command::Bench(_) | Command::Loadtest(_) | Command::Fetch(_) => None,
        }
    }

    fn run(self) -> common::CliResult {
        match self {
            Command::Info(a) => info::run(a),
            Command::Generate(a) => generate::run(a),
            Command::Chat(a) => chat::run(a),
            Command::Compress(a) => compress::run(a),
            Command::Perplexity(a) => perplexity::run(a),
            Command::Bench(a) => bench::run(a),
            Command::Calibrate(a) => calibrate::run(a),
            Command::Eval(a) => eval::run(a),
            Command::Tune(a) => tune::run(a),
            Command::Serve(a) => serve::run(a),
            Command::Loadtest(a) => loadtest::run(a),
            Command::Fetch(a) => fetch::run(a),
        }
    }
}

fn main() -> ExitCode {
    let command = Cli::parse().command;
    let result = match command.model_threads() {
        Some(threads) => common::init_threads(threads).and_then(|()| {
            kvslim_engine::on_workers(move || command.run().map_err(|e| common::message(&*e))).map_err(Into::into)
        }),
        None => command.run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", common::message(&*e));
            ExitCode::FAILURE
        }
    }
}
