//! `kvslim` on the real Qwen2.5-Coder-1.5B through its alias: a short
//! greedy generation and one chat turn through the model's own ChatML
//! template (`.ci/run` fetches the model first; see
//! `crates/models/tests/qwen25_coder_1_5b.rs` for its parity with llama.cpp).

mod common;

use common::kvslim_with_stdin;
use std::process::Output;

const MODEL: &str = "qwen2.5-coder-1.5b";

fn kvslim(args: &[&str], stdin: &str) -> Output {
    let o = kvslim_with_stdin(args, stdin);
    assert!(o.status.success(), "kvslim {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    o
}

/// Greedy code completion under the full cache and under H2O: the
/// function's obvious body comes out in both.
#[test]
fn generate_completes_a_function() {
    let prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";
    for policy in ["full", "h2o:heavy=16,recent=16"] {
        let o = kvslim(
            &["generate", "--model", MODEL, "--prompt", prompt, "--max-tokens", "24", "--policy", policy, "--json"],
            "",
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let text = v["text"].as_str().unwrap();
        assert_eq!(v["token_ids"].as_array().unwrap().len(), 24, "{policy}: {text}");
        assert!(text.contains("return") || text.contains("if n"), "{policy}: {text:?}");
    }
}

/// One chat turn from stdin: the ChatML prompt the template renders, and a
/// reply that is the asked-for Python function, ended by `<|im_end|>`.
#[test]
fn chat_turn_answers_with_code() {
    let o = kvslim(
        &["chat", "--model", MODEL, "--max-tokens", "64", "--show-prompt"],
        "Write a Python function square(x) that returns x squared. Reply with code only.\n",
    );
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(err.contains("<|im_start|>user\nWrite a Python function square(x)"), "{err}");
    assert!(err.contains("<|im_start|>assistant\n"), "{err}");
    assert!(err.contains("end of turn"), "the reply should end at <|im_end|>: {err}");
    assert!(out.contains("def square(x)") && out.contains("return"), "{out}");
}
