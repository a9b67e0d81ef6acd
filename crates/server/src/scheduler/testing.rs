//! Fixtures for the scheduler's unit tests: a tiny random model, a
//! tokenizer whose pieces the tests name, and requests built around them.

use super::events::Event;
use super::request::Request;
use super::sequence::Running;
use kvslim_cache::PolicySpec;
use kvslim_engine::{SamplingParams, Session};
use kvslim_models::tokenizer::scored::{ScoredVocab, SpaceStyle};
use kvslim_models::tokenizer::TokenizerKind;
use kvslim_models::{Logits, Model, Tokenizer};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub const EOS: u32 = 2;
/// The three bytes of "€", one token each.
pub const EURO: [u32; 3] = [3, 4, 5];
/// "Hel", "lo", " wor".
pub const HEL: u32 = 6;
pub const LO: u32 = 7;
pub const WOR: u32 = 8;
const PIECES: [&str; 16] =
    ["<unk>", "<s>", "</s>", "<0xE2>", "<0x82>", "<0xAC>", "Hel", "lo", " wor", "ld", "!", "a", "b", "c", "d", "e"];

/// A two-layer Llama-style model with random weights over [`tokenizer`]'s
/// vocabulary, 64 tokens of context.
pub fn tiny_model() -> Model {
    let config = kvslim_models::config::ModelConfig {
        context_len: 64,
        ..kvslim_engine::synthetic::llama_config(2, 32, 48, 4, 2, 8, PIECES.len())
    };
    kvslim_engine::synthetic::random_model(config, kvslim_kernels::DType::F32, 7, 3.0).expect("random model")
}

/// The pieces above: `<unk>`, BOS and EOS special, bytes as `<0xXX>`.
pub fn tokenizer() -> Tokenizer {
    let pieces: Vec<String> = PIECES.iter().map(|p| p.to_string()).collect();
    let special = (0..pieces.len()).map(|i| i < 3).collect();
    let vocab = ScoredVocab::new(pieces, vec![0.0; PIECES.len()], special, SpaceStyle::Plain, false);
    Tokenizer {
        kind: TokenizerKind::Scored(Box::new(vocab)),
        add_bos: true,
        bos: Some(1),
        eos: vec![EOS],
        chat_template: None,
    }
}

/// A greedy `full` request reserving 1000 bytes, and its events.
pub fn request(prompt: Vec<u32>, max_tokens: usize) -> (Request, UnboundedReceiver<Event>) {
    let (events, rx) = unbounded_channel();
    let req = Request {
        prompt,
        max_tokens,
        sampling: SamplingParams::default(),
        policy: PolicySpec::full(),
        stop: Vec::new(),
        kv_bytes: 1000,
        beams: 1,
        length_penalty: 1.0,
        logprobs: None,
        prompt_logprobs: None,
        deadline: None,
        events,
        context: None,
        compress: None,
    };
    (req, rx)
}

/// `req` with its prompt prefilled in a fresh session and the logits of
/// its last position (its first token not sampled yet).
pub fn prefilled(model: &Model, req: Request) -> (Running<'_>, Vec<f32>) {
    let n = req.prompt.len();
    let mut session = Session::new(model, &req.policy, n + req.max_tokens, n).expect("session");
    let logits = session.feed(&req.prompt, Logits::Last).expect("prefill").to_vec();
    (Running::new(session, req, 0), logits)
}

/// Every event sent so far.
pub fn events(rx: &mut UnboundedReceiver<Event>) -> Vec<Event> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

/// The text of `events`, and the finish reason and completion tokens of
/// the `Done` among them.
pub fn outcome(events: &[Event]) -> (String, Option<(&'static str, usize)>) {
    let text = events.iter().filter_map(|e| if let Event::Text(t, _) = e { Some(t.as_str()) } else { None }).collect();
    let done =
        events.iter().find_map(|e| if let Event::Done(f) = e { Some((f.reason, f.completion_tokens)) } else { None });
    (text, done)
}

/// What plain greedy decoding gives after `prompt`: up to `n` tokens,
/// ending at EOS (not included).
pub fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = Session::new(model, &PolicySpec::full(), prompt.len() + n, prompt.len()).expect("session");
    let mut sampler = kvslim_engine::Sampler::new(SamplingParams::default());
    let mut logits = s.feed(prompt, Logits::Last).expect("prefill").to_vec();
    let mut out = Vec::new();
    while out.len() < n {
        let id = sampler.sample(&logits);
        if id == EOS {
            break;
        }
        out.push(id);
        logits = s.feed(&[id], Logits::Last).expect("decode").to_vec();
    }
    out
}
