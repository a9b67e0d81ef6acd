//! `kvslim compress`: prefill a document once under a policy and save the
//! compressed context to a file; `generate --context` and `chat
//! --context` then ask it questions without prefilling it again.

use crate::common::{require_tokenizer, CliResult, ModelArgs, PolicyArgs, PromptArgs};
use kvslim_cache::PolicySpec;
use kvslim_engine::context::{Context, Framing};
use kvslim_models::chat::ChatMessage;
use kvslim_models::Model;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
#[command(
    mut_arg("prompt", |a| a.help("The document's text")),
    mut_arg("prompt_file", |a| a.help("Read the document from this file (byte for byte)"))
)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    document: PromptArgs,
    /// The compressed context's file (written through a temporary file
    /// beside it, renamed into place).
    #[arg(long, short = 'o')]
    output: PathBuf,
    /// Frame the document as the first user message of a chat (rendered by
    /// the model's chat template), so questions follow as chat turns:
    /// what an instruction-tuned model answers best. Without it the text
    /// is taken as it is and a question's text is appended to it.
    #[arg(long)]
    chat: bool,
    /// With --chat: a system prompt before the document.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Print one JSON object (tokens, bytes, seconds) instead of a summary line.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> CliResult {
    let text = a.document.read()?;
    let (loaded, path) = a.model.load_with_path()?;
    let tok = require_tokenizer(&loaded.tokenizer)?;
    let chat = a.model.chat_format(tok, &path)?;
    let framing = if a.chat {
        let mut m: Vec<ChatMessage> = a.system.iter().map(|s| ChatMessage::new("system", s.as_str())).collect();
        m.push(ChatMessage::new("user", text));
        Framing::Chat(m)
    } else {
        Framing::Text(text)
    };
    let start = Instant::now();
    let ctx = Context::compress_framed(&loaded.model, &a.policy.spec, tok, &chat, &framing)?;
    let seconds = start.elapsed().as_secs_f64();
    ctx.save(&a.output)?;
    let file_bytes = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(0);
    let (kv, full) = (ctx.kv_bytes().kv, ctx.kv_bytes_full());
    if a.json {
        let v = serde_json::json!({
            "context": a.output,
            "tokens": ctx.tokens().len(),
            "policy": ctx.policy().to_string(),
            "kv_bytes": kv,
            "kv_bytes_full": full,
            "file_bytes": file_bytes,
            "seconds": seconds,
        });
        println!("{v}");
    } else {
        eprintln!(
            "[{} tokens compressed in {seconds:.1} s under {}: K/V {:.2} MiB kept of {:.2} MiB full ({:.1}%); {} ({:.2} MiB)]",
            ctx.tokens().len(),
            ctx.policy(),
            kv as f64 / 1048576.0,
            full as f64 / 1048576.0,
            100.0 * kv as f64 / full.max(1) as f64,
            a.output.display(),
            file_bytes as f64 / 1048576.0,
        );
    }
    Ok(())
}

/// Loads `--context FILE` for a model, saying how long it took on stderr.
pub fn load_context(model: &Model, path: &Path) -> CliResult<Context> {
    let start = Instant::now();
    let ctx = Context::load(model, path)?;
    eprintln!(
        "[context {}: {} tokens under {}, K/V {:.2} MiB, loaded in {:.2} s]",
        path.display(),
        ctx.tokens().len(),
        ctx.policy(),
        ctx.kv_bytes().kv as f64 / 1048576.0,
        start.elapsed().as_secs_f64()
    );
    Ok(ctx)
}

/// `--policy` names the context's policy only when compressing: a
/// question on a context runs the policy it was compressed under.
pub fn refuse_policy_with_context(policy: &PolicySpec) -> CliResult {
    if *policy != PolicySpec::full() {
        return Err(format!(
            "--policy {policy} does not apply with --context: the context's own policy (chosen by `kvslim compress`) keeps running"
        )
        .into());
    }
    Ok(())
}
