//! `kvslim chat`: a multi-turn conversation on stdin/stdout through the
//! model's own chat template.
//!
//! * On a terminal: a `> ` prompt, each line is a user turn, the reply
//!   streams as it is generated.
//! * Not a terminal (a pipe, a file): each non-empty line of stdin is one
//!   user turn and each reply is printed on its own line(s), so a
//!   conversation can be scripted and tested.
//! * `/reset` forgets the history (the system prompt stays), `/quit` (or
//!   `/exit`, or end of input) leaves.
//! * Each turn renders the whole history and runs it from scratch with the
//!   chosen `--policy` (no KV cache is kept between turns).
//! * `--context FILE` (from `kvslim compress`): the conversation follows
//!   a compressed document; each turn runs on a fork of its cache, so only
//!   the conversation's tokens are fed, never the document's.

use crate::common::{require_tokenizer, CliResult, ModelArgs, PolicyArgs, SamplingArgs};
use crate::draft::{DraftArgs, DraftKind, DraftModel};
use kvslim_engine::context::{Context, Question};
use kvslim_engine::generate::StopReason;
use kvslim_engine::{generate, speculative_run, DraftLength, GenerateOptions, SamplingParams, Verification};
use kvslim_models::chat::{ChatFormat, ChatMessage};
use kvslim_models::tokenizer::StreamDecoder;
use kvslim_models::{Model, Tokenizer};
use std::io::{BufRead, IsTerminal, Write};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System prompt put first in the conversation.
    #[arg(long, conflicts_with = "context")]
    system: Option<String>,
    /// Chat about a compressed context saved by `kvslim compress` (its
    /// system prompt and policy come with it).
    #[arg(long, value_name = "FILE", conflicts_with = "draft_model")]
    context: Option<std::path::PathBuf>,
    /// Maximum number of new tokens per reply.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Print the rendered prompt of each turn on stderr.
    #[arg(long)]
    show_prompt: bool,
    /// With --draft-model: greedy speculative decoding (copies where the
    /// conversation has a match, else the draft model's drafts).
    #[command(flatten)]
    draft: DraftArgs,
}

/// What a line of input asks for.
#[derive(Debug, PartialEq, Eq)]
enum Input<'a> {
    Skip,
    Quit,
    Reset,
    Unknown(&'a str),
    Turn(&'a str),
}

fn classify(line: &str) -> Input<'_> {
    let t = line.trim();
    match t {
        "" => Input::Skip,
        "/quit" | "/exit" => Input::Quit,
        "/reset" => Input::Reset,
        _ if t.starts_with('/') && !t.contains(char::is_whitespace) => Input::Unknown(t),
        _ => Input::Turn(line.trim_end_matches(['\r', '\n'])),
    }
}

/// The conversation so far, with the system prompt kept across `/reset`.
struct History {
    system: Option<String>,
    turns: Vec<ChatMessage>,
}

impl History {
    fn messages(&self) -> Vec<ChatMessage> {
        self.system.iter().map(|s| ChatMessage::new("system", s.as_str())).chain(self.turns.iter().cloned()).collect()
    }
}

pub fn run(a: Args) -> CliResult {
    if a.max_tokens == 0 {
        return Err("--max-tokens must be at least 1".into());
    }
    a.sampling.params().validate()?;
    let (loaded, path) = a.model.load_with_path()?;
    let tok = require_tokenizer(&loaded.tokenizer)?;
    let chat = a.model.chat_format(tok, &path)?;
    let draft = a.draft.load(tok, a.model.f32_activations)?;
    if draft.is_some() && a.sampling.temperature != 0.0 {
        return Err("--draft-model is greedy speculative decoding: add --temperature 0".into());
    }
    let context = match &a.context {
        Some(file) => {
            crate::compress::refuse_policy_with_context(&a.policy.spec)?;
            Some(crate::compress::load_context(&loaded.model, file)?)
        }
        None => None,
    };
    let interactive = std::io::stdin().is_terminal();
    match &chat {
        ChatFormat::Template(t) => eprintln!("[chat template from {}]", t.source()),
        ChatFormat::Plain => eprintln!("[the model has no chat template: plain `role: content` lines]"),
    }
    if interactive {
        eprintln!("[/reset forgets the conversation, /quit leaves]");
    }
    let mut history = History { system: a.system.clone(), turns: Vec::new() };
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut out = std::io::stdout();
    let mut turn = 0u64;
    loop {
        if interactive {
            write!(out, "> ")?;
            out.flush()?;
        }
        let Some(line) = lines.next() else {
            if interactive {
                writeln!(out)?;
            }
            break;
        };
        let line = line?;
        match classify(&line) {
            Input::Skip => continue,
            Input::Quit => break,
            Input::Reset => {
                history.turns.clear();
                eprintln!("[conversation reset]");
                continue;
            }
            Input::Unknown(cmd) => {
                eprintln!("[unknown command {cmd}: /reset, /quit]");
                continue;
            }
            Input::Turn(text) => {
                history.turns.push(ChatMessage::new("user", text));
                let engines = Engines { model: &loaded.model, context: context.as_ref(), draft: draft.as_ref() };
                match reply(&a, engines, tok, &chat, &history, turn, &mut out) {
                    Ok(r) => history.turns.push(ChatMessage::new("assistant", r)),
                    Err(e) => {
                        // a turn that cannot run (template error, context full) is dropped
                        history.turns.pop();
                        eprintln!("error: {e}");
                        if !interactive {
                            return Err(e);
                        }
                    }
                }
                turn += 1;
            }
        }
    }
    Ok(())
}

/// What a reply runs on: the model, and a saved context or a draft model.
struct Engines<'a> {
    model: &'a Model,
    context: Option<&'a Context>,
    draft: Option<&'a DraftModel>,
}

/// Generates, streams and returns one assistant reply.
fn reply(
    a: &Args,
    Engines { model, context, draft }: Engines<'_>,
    tok: &Tokenizer,
    chat: &ChatFormat,
    history: &History,
    turn: u64,
    out: &mut impl Write,
) -> CliResult<String> {
    // with a context, only the turns follow its cache
    let prompt = match context {
        Some(c) => c.question_tokens(tok, chat, Question::Messages(&history.turns))?,
        None => {
            let text = chat.render_messages(&history.messages())?;
            if a.show_prompt {
                eprintln!("[prompt]\n{text}\n[/prompt]");
            }
            chat.encode(tok, &text)?
        }
    };
    let before = context.map_or(0, |c| c.tokens().len());
    let ctx = model.config.context_len;
    if before + prompt.len() >= ctx {
        return Err(format!(
            "the conversation is {} tokens but the context is {ctx}: /reset to start over",
            before + prompt.len()
        )
        .into());
    }
    let opts = GenerateOptions {
        max_tokens: a.max_tokens.min(ctx - before - prompt.len()),
        sampling: SamplingParams { seed: a.sampling.seed.wrapping_add(turn), ..a.sampling.params() },
        policy: context.map_or_else(|| a.policy.spec.clone(), |c| c.policy().clone()),
        eos: chat.stop_ids(tok),
    };
    let stops = chat.stops();
    let mut stream = StreamDecoder::new();
    let mut shown = String::new();
    let on_token = |id| {
        let Ok(piece) = stream.push(tok, id) else { return true };
        shown.push_str(&piece);
        let _ = write!(out, "{piece}");
        let _ = out.flush();
        // an end-of-turn marker that is not one token ends the reply too
        !stops.iter().any(|s| shown.contains(s.as_str()))
    };
    let g = match (context, draft) {
        (Some(c), _) => c.generate(model, &prompt, &opts, on_token)?,
        (None, Some(d)) => {
            let max_len = prompt.len() + opts.max_tokens;
            let mut drafter = DraftKind::NgramModel.drafter(model, Some(d), &opts.policy, max_len);
            let v = Verification::Auto;
            speculative_run(model, &prompt, &opts, drafter.as_mut(), DraftLength::default(), v, on_token)?.generation
        }
        (None, None) => generate(model, &prompt, &opts, on_token)?,
    };
    let mut reply = tok.decode(&g.token_ids)?;
    chat.cut_at_stop(&mut reply);
    writeln!(out)?;
    let tps = crate::generate::decode_tok_s(&g);
    eprintln!(
        "[{} prompt + {} generated tokens, {}, first token {:.0} ms, {:.1} tok/s, KV {:.2} MiB, policy {}]",
        g.prompt_tokens,
        g.token_ids.len(),
        match g.stop {
            StopReason::MaxTokens => "hit --max-tokens",
            _ => "end of turn",
        },
        g.time_to_first_token_s * 1e3,
        tps,
        g.kv_bytes.kv as f64 / 1048576.0,
        opts.policy
    );
    Ok(reply.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_lines() {
        assert_eq!(classify("  "), Input::Skip);
        assert_eq!(classify("/quit"), Input::Quit);
        assert_eq!(classify("/exit\n"), Input::Quit);
        assert_eq!(classify(" /reset "), Input::Reset);
        assert_eq!(classify("/nope"), Input::Unknown("/nope"));
        assert_eq!(classify("/usr/bin is a path"), Input::Turn("/usr/bin is a path"));
        assert_eq!(classify("Hi there\r\n"), Input::Turn("Hi there"));
    }

    #[test]
    fn system_prompt_survives_reset() {
        let mut h = History { system: Some("Be brief.".into()), turns: vec![ChatMessage::new("user", "Hi")] };
        assert_eq!(h.messages().len(), 2);
        h.turns.clear();
        assert_eq!(h.messages(), vec![ChatMessage::new("system", "Be brief.")]);
    }
}
