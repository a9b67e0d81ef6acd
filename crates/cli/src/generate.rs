//! `kvslim generate`: sample a continuation and stream it.

use crate::common::{require_tokenizer, CliResult, ModelArgs, PolicyArgs, PromptArgs, SamplingArgs};
use crate::draft::{DraftArgs, DraftKind};
use kvslim_engine::context::Question;
use kvslim_engine::{
    beam_search, generate, speculative_run, BeamOptions, DraftLength, GenerateOptions, Generation, Verification,
};
use kvslim_models::tokenizer::StreamDecoder;
use std::io::Write;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Maximum number of new tokens.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Answer the prompt on a compressed context saved by `kvslim
    /// compress` (its policy keeps running; a chat context takes the
    /// prompt as the next user turn): only the prompt's tokens are fed,
    /// not the document's.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["beams", "speculative", "draft_model"])]
    context: Option<std::path::PathBuf>,
    /// Print one JSON object (`text`, `token_ids`, timings, KV bytes) instead of streaming.
    #[arg(long)]
    json: bool,
    /// Beam search with N beams (N > 1; greedy only): prints the best
    /// hypothesis, and `--json` lists all of them with their scores. Beams
    /// share the prompt's KV read-only until they diverge: unless --policy
    /// sets `page=P`, beam search stores K/V in pages of 16 tokens (same
    /// results as fixed slots; the prompt's KV is held once, not per beam).
    #[arg(long, default_value_t = 1)]
    beams: usize,
    /// Beam search length penalty α: score = logprob / len^α.
    #[arg(long, default_value_t = 1.0)]
    length_penalty: f32,
    /// Greedy speculative decoding, drafts from: `ngram` (prompt lookup),
    /// `self` (the model drafting for itself), `model` (--draft-model) or
    /// `ngram+model` (copies where the context has a match, else
    /// --draft-model; the default with --draft-model). The output is plain
    /// greedy decoding's (bit for bit; with --fast-verify up to rounding in
    /// the verification GEMM, which can flip a near tie).
    #[arg(long, value_enum)]
    speculative: Option<DraftKind>,
    #[command(flatten)]
    draft: DraftArgs,
    /// With --speculative: always verify drafts with one GEMM per matrix
    /// over the chunk (weights read once per pass). By default this happens
    /// only where it is a decode step's arithmetic (every matrix with the
    /// integer products of quantized weights); with f32 products logits
    /// differ from plain decoding by rounding, which can flip a near tie.
    #[arg(long, conflicts_with = "exact_verify")]
    fast_verify: bool,
    /// With --speculative: always verify token by token (one decode step's
    /// arithmetic each; weights read once per token).
    #[arg(long)]
    exact_verify: bool,
    /// Draft tokens per target pass (with --speculative): `auto` (the
    /// default) adapts to the acceptance, between 1 and 8 (`auto:M` up to
    /// M): longer after accepted drafts, shorter after rejected ones; a
    /// number drafts that many every time.
    #[arg(long, default_value = "auto", value_parser = parse_draft_len)]
    draft_len: DraftLength,
}

fn parse_draft_len(s: &str) -> Result<DraftLength, String> {
    let positive = |v: &str| match v.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{v}` is not a draft length ≥ 1")),
    };
    match s.strip_prefix("auto") {
        Some("") => Ok(DraftLength::default()),
        Some(rest) => match rest.strip_prefix(':') {
            Some(m) => positive(m).map(|max| DraftLength::Adaptive { max }),
            None => Err(format!("`{s}` is not `auto`, `auto:M` or a number")),
        },
        None => positive(s).map(DraftLength::Fixed),
    }
}

fn verification(a: &Args) -> Verification {
    if a.fast_verify {
        Verification::Fast
    } else if a.exact_verify {
        Verification::Exact
    } else {
        Verification::Auto
    }
}

pub fn run(a: Args) -> CliResult {
    if a.beams == 0 {
        return Err("--beams must be at least 1".into());
    }
    if a.beams > 1 && a.sampling.temperature != 0.0 {
        return Err("--beams > 1 is greedy beam search: drop --temperature".into());
    }
    if (a.speculative.is_some() || a.draft.draft_model.is_some()) && a.beams > 1 {
        return Err("--speculative and --draft-model do not combine with --beams".into());
    }
    let prompt_text = a.prompt.read()?;
    let (loaded, model_path) = a.model.load_with_path()?;
    let tok = require_tokenizer(&loaded.tokenizer)?;
    let draft_model = a.draft.load(tok, a.model.f32_activations)?;
    let speculative = DraftKind::resolve(a.speculative, draft_model.as_ref())?;
    if let Some(file) = &a.context {
        return run_on_context(&a, &loaded.model, tok, &model_path, file, &prompt_text);
    }
    let prompt = tok.encode(&prompt_text)?;
    if a.beams > 1 {
        return run_beams(&a, &loaded.model, tok, (&prompt_text, &prompt));
    }
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: a.sampling.params(),
        policy: a.policy.spec.clone(),
        eos: tok.eos.clone(),
    };
    if speculative.is_some() && a.sampling.temperature != 0.0 {
        return Err("speculative decoding (--speculative, --draft-model) is greedy only: drop --temperature".into());
    }
    let mut stream = StreamDecoder::new();
    let mut out = std::io::stdout().lock();
    if !a.json {
        write!(out, "{prompt_text}")?;
        out.flush()?;
    }
    let on_token = |id| {
        if !a.json {
            if let Ok(piece) = stream.push(tok, id) {
                let _ = write!(out, "{piece}");
                let _ = out.flush();
            }
        }
        true
    };
    let (g, spec_stats) = match speculative {
        None => (generate(&loaded.model, &prompt, &opts, on_token)?, None),
        Some(kind) => {
            let max_len = prompt.len() + a.max_tokens;
            let mut drafter = kind.drafter(&loaded.model, draft_model.as_ref(), &a.policy.spec, max_len);
            let run = speculative_run(
                &loaded.model,
                &prompt,
                &opts,
                drafter.as_mut(),
                a.draft_len,
                verification(&a),
                on_token,
            )?;
            (run.generation, Some(run.stats))
        }
    };
    let text = tok.decode(&g.token_ids)?;
    let tps = decode_tok_s(&g);
    if a.json {
        let v = generation_json(
            &text,
            &g,
            a.policy.spec.to_string(),
            serde_json::json!({
                "prompt_token_ids": prompt,
                "speculative": spec_stats.map(|st| serde_json::json!({
                    "drafter": speculative.map(DraftKind::name),
                    "draft_model": a.draft.draft_model,
                    "draft_len": match a.draft_len {
                        DraftLength::Fixed(k) => k.to_string(),
                        DraftLength::Adaptive { max } => format!("auto:{max}"),
                    },
                    "verification": match verification(&a).resolve(&loaded.model) {
                        Verification::Fast => "fast",
                        _ => "exact",
                    },
                    "target_passes": st.target_passes,
                    "drafted": st.drafted,
                    "accepted": st.accepted,
                    "replays": st.replays,
                    "tokens_per_pass": st.tokens_per_pass(),
                })),
            }),
        );
        writeln!(out, "{v}")?;
    } else {
        writeln!(out)?;
        eprintln!(
            "[{} prompt + {} generated tokens, first token {:.0} ms, {:.1} tok/s, KV {:.2} MiB allocated, policy {}]",
            g.prompt_tokens,
            g.token_ids.len(),
            g.time_to_first_token_s * 1e3,
            tps,
            g.kv_bytes.kv as f64 / 1048576.0,
            a.policy.spec
        );
    }
    if let Some(st) = spec_stats {
        eprintln!(
            "[speculative {}: {} target passes, {} drafted, {} accepted ({:.1}%), {:.2} tokens per pass, {} replays]",
            speculative.map_or("", DraftKind::name),
            st.target_passes,
            st.drafted,
            st.accepted,
            if st.drafted > 0 { 100.0 * st.accepted as f64 / st.drafted as f64 } else { 0.0 },
            st.tokens_per_pass(),
            st.replays
        );
    }
    Ok(())
}

/// Generated tokens per second after the first.
pub(crate) fn decode_tok_s(g: &Generation) -> f64 {
    if g.decode_s > 0.0 {
        (g.token_ids.len().saturating_sub(1)) as f64 / g.decode_s
    } else {
        0.0
    }
}

/// The `--json` object of a generation: the fields every run prints, and
/// `extra`'s (keys print sorted, so where they are added does not matter).
fn generation_json(text: &str, g: &Generation, policy: String, extra: serde_json::Value) -> serde_json::Value {
    let mut v = serde_json::json!({
        "text": text,
        "token_ids": g.token_ids,
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.token_ids.len(),
        "stop_reason": g.stop,
        "policy": policy,
        "time_to_first_token_s": g.time_to_first_token_s,
        "decode_tok_s": decode_tok_s(g),
        "kv_bytes_allocated": g.kv_bytes.kv,
        "kv_metadata_bytes": g.kv_bytes.metadata,
    });
    if let (Some(fields), serde_json::Value::Object(more)) = (v.as_object_mut(), extra) {
        fields.extend(more);
    }
    v
}

/// `generate --context`: the prompt as a question on a saved context.
fn run_on_context(
    a: &Args,
    model: &kvslim_models::Model,
    tok: &kvslim_models::tokenizer::Tokenizer,
    model_path: &std::path::Path,
    file: &std::path::Path,
    question: &str,
) -> CliResult {
    crate::compress::refuse_policy_with_context(&a.policy.spec)?;
    let ctx = crate::compress::load_context(model, file)?;
    let chat = a.model.chat_format(tok, model_path)?;
    let q = ctx.question_tokens(tok, &chat, Question::Text(question))?;
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: a.sampling.params(),
        policy: ctx.policy().clone(),
        eos: chat.stop_ids(tok),
    };
    let mut stream = StreamDecoder::new();
    let mut out = std::io::stdout().lock();
    let stops = chat.stops();
    let mut shown = String::new();
    let g = ctx.generate(model, &q, &opts, |id| {
        let Ok(piece) = stream.push(tok, id) else { return true };
        shown.push_str(&piece);
        if !a.json {
            let _ = write!(out, "{piece}");
            let _ = out.flush();
        }
        !stops.iter().any(|s| shown.contains(s.as_str()))
    })?;
    let mut text = tok.decode(&g.token_ids)?;
    chat.cut_at_stop(&mut text);
    let tps = decode_tok_s(&g);
    if a.json {
        let v = generation_json(
            &text,
            &g,
            ctx.policy().to_string(),
            serde_json::json!({
                "question_token_ids": q,
                "context": file,
                "context_tokens": ctx.tokens().len(),
            }),
        );
        writeln!(out, "{v}")?;
    } else {
        writeln!(out)?;
        eprintln!(
            "[{} context + {} question + {} generated tokens, first token {:.0} ms, {:.1} tok/s, KV {:.2} MiB, policy {}]",
            ctx.tokens().len(),
            q.len(),
            g.token_ids.len(),
            g.time_to_first_token_s * 1e3,
            tps,
            g.kv_bytes.kv as f64 / 1048576.0,
            ctx.policy()
        );
    }
    Ok(())
}

fn run_beams(
    a: &Args,
    model: &kvslim_models::Model,
    tok: &kvslim_models::tokenizer::Tokenizer,
    (prompt_text, prompt): (&str, &[u32]),
) -> CliResult {
    let opts = BeamOptions {
        beams: a.beams,
        max_tokens: a.max_tokens,
        length_penalty: a.length_penalty,
        early_stopping: true,
        policy: a.policy.spec.clone(),
        eos: tok.eos.clone(),
        keep_caches: false,
    };
    let start = std::time::Instant::now();
    let hyps = beam_search(model, prompt, &opts)?;
    let elapsed = start.elapsed().as_secs_f64();
    let best = hyps.first().ok_or("beam search found no hypothesis")?;
    let text = tok.decode(&best.token_ids)?;
    let mut out = std::io::stdout().lock();
    if a.json {
        let mut all = Vec::with_capacity(hyps.len());
        for h in &hyps {
            all.push(serde_json::json!({
                "text": tok.decode(&h.token_ids)?,
                "token_ids": h.token_ids,
                "logprob": h.logprob,
                "score": h.score,
                "stop_reason": if h.eos { "eos" } else { "max_tokens" },
            }));
        }
        let v = serde_json::json!({
            "text": text,
            "token_ids": best.token_ids,
            "prompt_token_ids": prompt,
            "prompt_tokens": prompt.len(),
            "completion_tokens": best.token_ids.len(),
            "stop_reason": if best.eos { "eos" } else { "max_tokens" },
            "policy": a.policy.spec.to_string(),
            "beams": a.beams,
            "length_penalty": a.length_penalty,
            "hypotheses": all,
            "elapsed_s": elapsed,
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "{prompt_text}{text}")?;
        eprintln!(
            "[{} prompt + {} generated tokens, {} beams, logprob {:.3}, score {:.3}, {:.2} s, policy {}]",
            prompt.len(),
            best.token_ids.len(),
            a.beams,
            best.logprob,
            best.score,
            elapsed,
            a.policy.spec
        );
    }
    Ok(())
}
