//! `kvslim fetch MODEL`: resolve a model spec now (downloading it when it
//! is absent and allowed) and print its local path, without loading it —
//! for CI and for preparing a machine before going offline, and usable for
//! models whose architecture this build cannot run yet.

use crate::common::CliResult;

#[derive(clap::Args)]
pub struct Args {
    /// An alias (`smollm2-135m`, `gemma3-270m`, `stories260k`),
    /// `hf:org/repo[/file]`, or a path.
    model: String,
}

pub fn run(a: Args) -> CliResult {
    let path = kvslim_hub::resolve_model(&a.model)?;
    println!("{}", path.display());
    Ok(())
}
