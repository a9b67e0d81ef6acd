//! Mutation fuzzing of the server's request JSON: bodies of
//! `/v1/completions` and `/v1/chat/completions` (through a ChatML-style
//! template with `tools`) go through [`check_body`], the same parsing,
//! validation and sizing the endpoints run before queuing anything. Every
//! body must be admitted or refused with a clear message: no panic, no
//! hang, no allocation far beyond the body's size (a huge `n`, `max_tokens`,
//! prompt list or stop list is refused before it is allocated for).
//! `KVSLIM_FUZZ_ITERS` sets the inputs (see `testing/fuzz`).

mod common;
use kvslim_fuzz as fuzz;

use fuzz::{iters, run_seeded, Limits};
use kvslim_cache::PolicySpec;
use kvslim_models::chat::{ChatFormat, ChatTemplate};
use kvslim_server::request::{check_body, Kind};
use kvslim_server::{AppState, ServerConfig};
use std::sync::Arc;

const CHATML: &str = "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}\
{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

const COMPLETIONS: &[&str] = &[
    r#"{"prompt": "Once upon a time", "max_tokens": 8}"#,
    r#"{"prompt": ["Once", "upon a time"], "max_tokens": 4, "n": 2, "seed": 7, "temperature": 0.8, "top_p": 0.9}"#,
    r#"{"prompt": [1, 403, 407, 261], "echo": true, "max_tokens": 0, "logprobs": 3}"#,
    r#"{"prompt": [[1, 403], [1, 407, 261]], "max_tokens": 2, "stop": ["\n", "the"], "stream": true}"#,
    r#"{"prompt": "Lily", "kv_policy": "h2o:heavy=10%,recent=10%", "max_tokens": 16, "stop": "."}"#,
    r#"{"prompt": "Tom", "beams": 3, "length_penalty": 0.5, "max_tokens": 6, "kv_policy": "window:recent=8"}"#,
    r#"{"model": "stories260k", "prompt": "x", "max_completion_tokens": 3, "kv_policy": "full:page=16,kv_dtype=q8"}"#,
];

const CHATS: &[&str] = &[
    r#"{"messages": [{"role": "user", "content": "Tell a story"}], "max_tokens": 8}"#,
    r#"{"messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]}], "logprobs": true, "top_logprobs": 2, "n": 2}"#,
    r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": [true, null]}}}], "stream": true}"#,
    r#"{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]}, {"role": "tool", "content": "42"}], "kv_policy": "h2o:heavy=4,recent=4,sink=1"}"#,
];

const DICT: &[&str] = &[
    "\"prompt\": ",
    "\"messages\": ",
    "\"role\": ",
    "\"content\": ",
    "\"tools\": ",
    "\"max_tokens\": ",
    "\"max_completion_tokens\": ",
    "\"n\": ",
    "\"beams\": ",
    "\"logprobs\": ",
    "\"top_logprobs\": ",
    "\"echo\": ",
    "\"stream\": ",
    "\"stop\": ",
    "\"seed\": ",
    "\"temperature\": ",
    "\"top_p\": ",
    "\"length_penalty\": ",
    "\"kv_policy\": ",
    "\"h2o:heavy=1,recent=1\"",
    "\"chai:plan=missing.json\"",
    "\"full:page=0\"",
    "[[]]",
    "[1, 2, 3]",
    "[\"a\", \"b\"]",
    "[{}]",
    "{\"type\": \"text\"}",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"<|im_end|>\"",
    "{% for %}",
    "null",
    "true",
    "false",
    "[]",
    "{}",
    ",",
    ":",
    "\"",
];

fn state() -> AppState {
    let m = common::stories();
    let config = ServerConfig {
        policy: PolicySpec::full(),
        limits: kvslim_server::Limits { kv_memory: 64 << 20, ..Default::default() },
        model_name: "stories260k".into(),
    };
    let template = ChatTemplate::new(CHATML, "fuzz template", Some("<s>".into()), Some("</s>".into()))
        .expect("the fuzz template parses");
    AppState::new(Arc::new(m.model), Arc::new(m.tokenizer.expect("tokenizer")), config)
        .with_chat(Ok(ChatFormat::Template(Box::new(template))))
}

#[test]
fn fuzz_request_json() {
    let st = state();
    let seeds: Vec<(Kind, &'static str)> =
        COMPLETIONS.iter().map(|s| (Kind::Completion, *s)).chain(CHATS.iter().map(|s| (Kind::Chat, *s))).collect();
    // every seed is a request the endpoint accepts
    for (kind, s) in &seeds {
        check_body(&st, *kind, s.as_bytes()).unwrap_or_else(|e| panic!("seed {s} refused: {}", e.message));
    }
    let report = run_seeded(
        "request-json",
        iters(3_000),
        Limits::default(),
        seeds,
        |r, &(kind, seed): &(Kind, &'static str)| {
            let (body, what) = fuzz::mutate_text(r, seed, DICT);
            let len = body.len();
            ((kind, body), len, what)
        },
        move |(kind, body): &(Kind, String)| check_body(&st, *kind, body.as_bytes()).map(|_| ()).map_err(|e| e.message),
    );
    // the mutations must leave some bodies valid, or the fuzzer only tests the JSON parser
    assert!(report.accepted > 0 && report.rejected > 0, "{report:?}");
}

#[test]
fn limits_are_checked_before_allocating() {
    let st = state();
    let refuse = |kind, body: String, needle: &str| {
        let e = check_body(&st, kind, body.as_bytes()).expect_err(&body);
        assert!(e.message.contains(needle), "{body}: {}", e.message);
    };
    refuse(Kind::Completion, r#"{"prompt": "a", "n": 100000000}"#.into(), "n must be between 1 and 16");
    let many = vec!["\"a\""; 65].join(",");
    refuse(Kind::Completion, format!(r#"{{"prompt": [{many}]}}"#), "at most 64 prompts");
    let stops = vec!["\"x\""; 17].join(",");
    refuse(Kind::Completion, format!(r#"{{"prompt": "a", "stop": [{stops}]}}"#), "at most 16 stop strings");
    let long = "y".repeat(1025);
    refuse(Kind::Completion, format!(r#"{{"prompt": "a", "stop": "{long}"}}"#), "at most 1024 bytes");
    refuse(Kind::Completion, r#"{"prompt": [1, 70000]}"#.into(), "outside the vocabulary");
    refuse(Kind::Chat, r#"{"messages": []}"#.into(), "non-empty list");
    // max_tokens far past the context is clipped to it, not allocated for
    assert_eq!(check_body(&st, Kind::Completion, br#"{"prompt": "a", "max_tokens": 9223372036854775807}"#).unwrap(), 1);
    assert_eq!(check_body(&st, Kind::Completion, br#"{"prompt": ["a", "b"], "n": 3}"#).unwrap(), 6);
}
