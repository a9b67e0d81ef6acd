//! Log-probs, `echo`, several prompts and `n` over real HTTP (stories260K):
//! echoed prompt log-probs equal in-process teacher forcing under the same
//! policy, generated tokens' log-probs equal teacher forcing of what was
//! sampled (whatever the temperature), the response shapes OpenAI clients
//! and lm-evaluation-harness read, and the 400s for invalid combinations.

use kvslim_cache::PolicySpec;
use kvslim_engine::{perplexity, PerplexityOptions};
use kvslim_loadtest::http_client::{self, Response};
use kvslim_models::LoadedModel;
use kvslim_server::scheduler::apply_default_page;
use kvslim_server::Limits;
use serde_json::{json, Value};
use std::collections::HashMap;
mod common;

use common::{start, stories, stream};

const PAGE: usize = 16;

fn limits() -> Limits {
    Limits { kv_memory: 64 << 20, max_batch: 16, queue_limit: 64, kv_page_size: PAGE, ..Limits::default() }
}

fn post(addr: &str, path: &str, body: &Value) -> Response {
    http_client::request(addr, "POST", path, Some(&body.to_string())).unwrap()
}

fn ok(addr: &str, path: &str, body: &Value) -> Value {
    let r = post(addr, path, body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn assert_error(r: &Response, needle: &str, param: &str) {
    assert_eq!(r.status, 400, "body: {}", r.text());
    let v = r.json();
    let msg = v["error"]["message"].as_str().unwrap_or_else(|| panic!("no OpenAI error shape: {}", r.text()));
    assert!(msg.contains(needle), "message {msg:?} should mention {needle:?}");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let want = if param == "null" { Value::Null } else { json!(param) };
    assert_eq!(v["error"]["param"], want, "{msg}");
}

/// The spec the server runs for `kv_policy` (its default page size applied).
fn served_spec(policy: &str) -> PolicySpec {
    let mut spec = PolicySpec::parse(policy).unwrap();
    apply_default_page(&mut spec, PAGE);
    spec
}

/// `ln p(ids[i+1] | ids[..=i])` by `kvslim perplexity`'s teacher forcing:
/// the first `prefill` tokens as one chunk, the rest one decode step each.
fn teacher_forced(m: &LoadedModel, ids: &[u32], policy: &str, prefill: usize) -> Vec<f64> {
    let mut opts = PerplexityOptions::new(served_spec(policy));
    opts.prefill = prefill;
    perplexity(&m.model, ids, &opts, |_, _| {}).unwrap().logprobs
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst <= 1e-5, "{what}: max |Δ| {worst:e}");
}

/// A token's bytes from its display string (`bytes:\xNN…` when partial).
fn bytes_of(s: &str) -> Vec<u8> {
    match s.strip_prefix("bytes:") {
        Some(hex) => hex.split("\\x").filter(|h| !h.is_empty()).map(|h| u8::from_str_radix(h, 16).unwrap()).collect(),
        None => s.as_bytes().to_vec(),
    }
}

/// Ids from the completion `tokens` strings, through a byte → id map of
/// the vocabulary (the test asserts the tokens it meets are unambiguous).
fn ids_of(m: &LoadedModel, tokens: &Value) -> Vec<u32> {
    let tok = m.tokenizer.as_ref().unwrap();
    let mut by_bytes: HashMap<Vec<u8>, Vec<u32>> = HashMap::new();
    for id in 0..tok.vocab_size() as u32 {
        let tb = tok.token_bytes(id).unwrap();
        by_bytes.entry(tb.bytes).or_default().push(id);
    }
    tokens
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let ids = &by_bytes[&bytes_of(t.as_str().unwrap())];
            // a character with a piece of its own is never sampled as its
            // byte-fallback token `<0xNN>` in these texts
            let pieces: Vec<u32> = if ids.len() > 1 {
                ids.iter().copied().filter(|&i| !tok.token_text(i).unwrap().starts_with("<0x")).collect()
            } else {
                ids.clone()
            };
            assert_eq!(pieces.len(), 1, "token {t} is ambiguous: {ids:?}");
            pieces[0]
        })
        .collect()
}

const STORY: &str = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball under a tree.";

#[test]
fn echoed_prompt_logprobs_equal_teacher_forcing_under_each_policy() {
    let addr = start(limits());
    let m = stories();
    let ids = m.tokenizer.as_ref().unwrap().encode(STORY).unwrap();
    assert!(ids.len() > 40, "the prompt must exceed the budgets below: {}", ids.len());
    let mut by_policy = Vec::new();
    for policy in
        ["full", "h2o:heavy=8,recent=8", "h2o:heavy=8,recent=8,prefill=stream:8", "window:recent=16,kv_dtype=q8"]
    {
        let body = json!({"prompt": STORY, "echo": true, "logprobs": 2, "max_tokens": 0, "kv_policy": policy});
        let v = ok(&addr, "/v1/completions", &body);
        let c = &v["choices"][0];
        assert_eq!(c["text"], STORY);
        assert_eq!(c["finish_reason"], "length");
        assert_eq!(v["usage"]["completion_tokens"], 0);
        assert_eq!(v["usage"]["prompt_tokens"], ids.len());
        let lp = &c["logprobs"];
        assert_eq!(lp["tokens"].as_array().unwrap().len(), ids.len());
        assert_eq!(ids_of(&m, &lp["tokens"]), ids, "{policy}: tokens are the prompt's");
        assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
        let got = floats(&Value::Array(lp["token_logprobs"].as_array().unwrap()[1..].to_vec()));
        // one prefill of the whole sequence, as the server prefills the prompt
        let want = teacher_forced(&m, &ids, policy, ids.len());
        assert_close(&got, &want, policy);
        // text offsets rise and stay within the text
        let offs: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
        assert!(offs.windows(2).all(|w| w[0] <= w[1]) && *offs.last().unwrap() as usize <= STORY.len());
        by_policy.push((policy, got));
    }
    // the log-probs are each policy's own: streaming prefill under a budget
    // of 16 changes them; a single-chunk prefill attends to the whole prompt
    assert_eq!(by_policy[0].1, by_policy[1].1, "one-chunk prefill sees the whole prompt");
    assert_ne!(by_policy[0].1, by_policy[2].1, "prefill=stream:8 evicts inside the prompt");
    // a one-chunk prefill attends to its own chunk's exact keys, so a
    // quantized window scores the prompt as full does (and teacher forcing
    // above agrees)
    assert_eq!(by_policy[0].1, by_policy[3].1);
}

#[test]
fn generated_logprobs_equal_teacher_forcing_whatever_the_temperature() {
    let addr = start(limits());
    let m = stories();
    let prompt = m.tokenizer.as_ref().unwrap().encode("Once upon a time").unwrap();
    for (policy, temperature) in
        [("full", 0.0), ("full", 1.5), ("h2o:heavy=4,recent=4", 0.0), ("h2o:heavy=4,recent=4", 1.2)]
    {
        let body = json!({"prompt": prompt, "max_tokens": 24, "temperature": temperature, "seed": 11, "logprobs": 5, "kv_policy": policy});
        let v = ok(&addr, "/v1/completions", &body);
        let c = &v["choices"][0];
        let lp = &c["logprobs"];
        let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
        let toks = lp["tokens"].as_array().unwrap();
        let eos = usize::from(c["finish_reason"] == "stop");
        assert_eq!(toks.len(), n + eos, "{policy}: one entry per generated token (and the EOS)");
        let generated = ids_of(&m, &Value::Array(toks[..n].to_vec()));
        let got = floats(&lp["token_logprobs"]);
        let seq: Vec<u32> = prompt.iter().chain(&generated).copied().collect();
        // prefill the prompt, then one decode step per generated token
        let want = teacher_forced(&m, &seq, policy, prompt.len());
        assert_close(&got[..n], &want[prompt.len() - 1..], &format!("{policy} at temperature {temperature}"));
        // the text is the tokens' bytes
        let text: Vec<u8> = toks[..n].iter().flat_map(|t| bytes_of(t.as_str().unwrap())).collect();
        assert_eq!(String::from_utf8_lossy(&text).trim_start(), c["text"].as_str().unwrap().trim_start());
        for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
            let mut vals: Vec<f64> = top.as_object().unwrap().values().map(|x| x.as_f64().unwrap()).collect();
            assert!((5..=6).contains(&vals.len()), "5 alternatives (+ the chosen token): {top}");
            vals.sort_by(|a, b| b.total_cmp(a));
            assert!(vals.iter().all(|&x| x <= 0.0));
            let chosen = got[i];
            assert!(vals.contains(&chosen), "the chosen token is listed");
            if temperature == 0.0 {
                assert_eq!(vals[0], chosen, "greedy picks the most likely token");
            }
        }
    }
}

#[test]
fn echo_with_max_tokens_one_has_prompt_plus_one_entries_and_streams_the_same() {
    let addr = start(limits());
    let body =
        json!({"prompt": "Once upon a time there was", "echo": true, "logprobs": 1, "max_tokens": 1, "temperature": 0});
    let v = ok(&addr, "/v1/completions", &body);
    let c = &v["choices"][0];
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert_eq!(c["logprobs"]["token_logprobs"].as_array().unwrap().len(), prompt_tokens + 1);
    assert!(c["text"].as_str().unwrap().starts_with("Once upon a time there was"));
    // lm-evaluation-harness's is_greedy: the last entry is its top entry
    let last = c["logprobs"]["token_logprobs"][prompt_tokens].as_f64().unwrap();
    let top = c["logprobs"]["top_logprobs"][prompt_tokens].as_object().unwrap();
    assert_eq!(top.values().map(|x| x.as_f64().unwrap()).fold(f64::MIN, f64::max), last);

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let chunks = stream(&addr, "/v1/completions", &sb);
    assert_eq!(chunks[0]["choices"][0]["text"], "Once upon a time there was", "the echo comes first");
    let text: String = chunks.iter().map(|ch| ch["choices"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(text, c["text"].as_str().unwrap());
    let mut lps = Vec::new();
    let mut tokens = Vec::new();
    for ch in &chunks {
        let l = &ch["choices"][0]["logprobs"];
        if !l.is_null() {
            lps.extend(l["token_logprobs"].as_array().unwrap().iter().cloned());
            tokens.extend(l["tokens"].as_array().unwrap().iter().cloned());
        }
    }
    assert_eq!(Value::Array(lps), c["logprobs"]["token_logprobs"]);
    assert_eq!(Value::Array(tokens), c["logprobs"]["tokens"]);
    assert_eq!(chunks.last().unwrap()["usage"]["prompt_tokens"], prompt_tokens);

    // echo without logprobs: the text only; max_tokens 0 returns the prompt
    let v = ok(&addr, "/v1/completions", &json!({"prompt": "Once upon", "echo": true, "max_tokens": 0}));
    assert_eq!(v["choices"][0]["text"], "Once upon");
    assert!(v["choices"][0]["logprobs"].is_null());
}

#[test]
fn several_prompts_and_n_choices() {
    let addr = start(limits());
    let prompts = ["Once upon a time", "The little dog"];
    let one = |p: &str, seed: u64| -> String {
        let v = ok(&addr, "/v1/completions", &json!({"prompt": p, "max_tokens": 12, "temperature": 0.9, "seed": seed}));
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let want: Vec<String> = vec![one(prompts[0], 7), one(prompts[0], 8), one(prompts[1], 7), one(prompts[1], 8)];
    let body = json!({"prompt": prompts, "n": 2, "max_tokens": 12, "temperature": 0.9, "seed": 7});
    let v = ok(&addr, "/v1/completions", &body);
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"].as_str().unwrap(), want[i], "choice {i}: prompt {} with seed 7 + {}", i / 2, i % 2);
    }
    let u = &v["usage"];
    let tok = stories().tokenizer.unwrap();
    let lens: usize = prompts.iter().map(|p| tok.encode(p).unwrap().len()).sum();
    assert_eq!(u["prompt_tokens"], lens, "each prompt counted once");
    assert_eq!(u["completion_tokens"], 4 * 12);

    // streamed: the same texts, chunks tagged by index, usage at the end
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let chunks = stream(&addr, "/v1/completions", &sb);
    let mut texts = vec![String::new(); 4];
    let mut finished = 0;
    for ch in &chunks {
        let c = &ch["choices"][0];
        texts[c["index"].as_u64().unwrap() as usize].push_str(c["text"].as_str().unwrap());
        finished += usize::from(!c["finish_reason"].is_null());
    }
    assert_eq!(texts, want);
    assert_eq!(finished, 4);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 4 * 12);

    // token-id lists, greedy: each choice equals its prompt alone
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let ids: Vec<Vec<u32>> = prompts.iter().map(|p| tok.encode(p).unwrap()).collect();
    let v = ok(
        &addr,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 10, "temperature": 0, "logprobs": 1, "echo": true}),
    );
    for (i, p) in prompts.iter().enumerate() {
        let alone = ok(
            &addr,
            "/v1/completions",
            &json!({"prompt": p, "max_tokens": 10, "temperature": 0, "logprobs": 1, "echo": true}),
        );
        let (b, a) = (&v["choices"][i], &alone["choices"][0]);
        assert_eq!(b["text"], a["text"]);
        assert_eq!(b["logprobs"]["tokens"], a["logprobs"]["tokens"]);
        let (bl, al) = (&b["logprobs"]["token_logprobs"], &a["logprobs"]["token_logprobs"]);
        assert!(bl[0].is_null() && al[0].is_null());
        // a batch of two decodes with other rounding than one sequence alone
        let tail = |l: &Value| floats(&Value::Array(l.as_array().unwrap()[1..].to_vec()));
        assert_close(&tail(bl), &tail(al), "batched vs alone");
    }
}

#[test]
fn chat_logprobs_in_openai_shape() {
    let addr = start(limits());
    let msgs = json!([{"role": "user", "content": "Once upon a time"}]);
    let body = json!({"messages": msgs, "max_tokens": 16, "temperature": 0, "logprobs": true, "top_logprobs": 3});
    let v = ok(&addr, "/v1/chat/completions", &body);
    let c = &v["choices"][0];
    let content = c["logprobs"]["content"].as_array().unwrap();
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(content.len(), n + usize::from(c["finish_reason"] == "stop"));
    let mut bytes = Vec::new();
    for e in &content[..n] {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let vals: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(vals.windows(2).all(|w| w[0] >= w[1]), "sorted: {vals:?}");
        assert_eq!(e["logprob"], top[0]["logprob"], "greedy: the chosen token is the most likely");
        assert_eq!(e["token"], top[0]["token"]);
        bytes.extend(e["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8));
    }
    // (SentencePiece: the text drops the dummy-prefix space of its first token)
    assert_eq!(String::from_utf8(bytes).unwrap().trim_start(), c["message"]["content"].as_str().unwrap().trim_start());

    // streamed: each chunk carries its tokens' entries
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let chunks = stream(&addr, "/v1/chat/completions", &sb);
    let streamed: Vec<Value> = chunks
        .iter()
        .filter(|ch| !ch["choices"][0]["logprobs"].is_null())
        .flat_map(|ch| ch["choices"][0]["logprobs"]["content"].as_array().unwrap().clone())
        .collect();
    assert_eq!(&streamed, content);

    // logprobs: true alone gives entries with no alternatives; n > 1 works
    let v = ok(
        &addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 4, "logprobs": true, "n": 3, "seed": 1}),
    );
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    assert!(v["choices"][2]["logprobs"]["content"][0]["top_logprobs"].as_array().unwrap().is_empty());
    // without logprobs the field stays null
    let v = ok(&addr, "/v1/chat/completions", &json!({"messages": msgs, "max_tokens": 4}));
    assert!(v["choices"][0]["logprobs"].is_null());
}

#[test]
fn invalid_logprob_and_choice_requests_are_400() {
    let addr = start(limits());
    let c = "/v1/completions";
    let chat = "/v1/chat/completions";
    let msgs = json!([{"role": "user", "content": "hi"}]);
    assert_error(&post(&addr, c, &json!({"prompt": "hi", "logprobs": 6})), "between 0 and 5", "logprobs");
    assert_error(&post(&addr, c, &json!({"prompt": "hi", "logprobs": true})), "top_logprobs", "logprobs");
    assert_error(&post(&addr, c, &json!({"prompt": "hi", "max_tokens": 0})), "echo", "max_tokens");
    assert_error(&post(&addr, c, &json!({"prompt": "hi", "n": 0})), "n must be", "n");
    assert_error(&post(&addr, c, &json!({"prompt": "hi", "n": 17})), "n must be", "n");
    assert_error(&post(&addr, c, &json!({"prompt": [], "max_tokens": 2})), "empty", "prompt");
    assert_error(&post(&addr, c, &json!({"prompt": "hi", "beams": 2, "n": 2})), "one choice", "n");
    assert_error(&post(&addr, c, &json!({"prompt": "hi", "beams": 2, "logprobs": 1})), "beam search", "logprobs");
    assert_error(&post(&addr, c, &json!({"prompt": ["hi", [1, 2]], "max_tokens": 2})), "invalid request", "null");
    assert_error(&post(&addr, chat, &json!({"messages": msgs, "logprobs": 3})), "true or false", "logprobs");
    assert_error(&post(&addr, chat, &json!({"messages": msgs, "top_logprobs": 2})), "logprobs: true", "top_logprobs");
    assert_error(
        &post(&addr, chat, &json!({"messages": msgs, "logprobs": true, "top_logprobs": 21})),
        "between 0 and 20",
        "top_logprobs",
    );
    // a prompt that fills the context is fine only for scoring (max_tokens 0 + echo)
    let full: Vec<u32> = (0..512).map(|i| 300 + (i % 100)).collect();
    let r = post(&addr, c, &json!({"prompt": full, "max_tokens": 1}));
    assert_eq!(r.status, 400, "{}", r.text());
    let v = ok(&addr, c, &json!({"prompt": full, "max_tokens": 0, "echo": true, "logprobs": 0}));
    assert_eq!(v["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap().len(), 512);
}

#[test]
fn tokenizer_endpoints_match_the_server_tokenizer() {
    let addr = start(limits());
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let ids = tok.encode("Once upon a time").unwrap();
    let v = ok(&addr, "/tokenize", &json!({"prompt": "Once upon a time"}));
    assert_eq!(v["tokens"], json!(ids));
    assert_eq!(v["count"], ids.len());
    let v = ok(&addr, "/tokenize", &json!({"prompt": "Once upon a time", "add_special_tokens": false}));
    let without: Vec<u32> = if tok.add_bos { ids[1..].to_vec() } else { ids.clone() };
    assert_eq!(v["tokens"], json!(without));
    let v = ok(&addr, "/detokenize", &json!({"tokens": ids}));
    assert_eq!(v["prompt"], "Once upon a time");
    let r = http_client::request(&addr, "GET", "/tokenizer_info", None).unwrap();
    assert_eq!(r.status, 200);
    let info = r.json();
    assert_eq!(info["eos_token"].as_str(), tok.token_text(tok.eos[0]).as_deref());
    assert_error(&post(&addr, "/detokenize", &json!({"tokens": [99999]})), "outside the vocabulary", "tokens");
    // a missing field is named; a body of the wrong shape is an invalid request
    assert_error(&post(&addr, "/tokenize", &json!({})), "`prompt` is required", "prompt");
    assert_error(&post(&addr, "/detokenize", &json!({})), "`tokens` is required", "tokens");
    assert_error(&post(&addr, "/v1/kv/policy", &json!({})), "`kv_policy` is required", "kv_policy");
    for path in ["/tokenize", "/detokenize", "/v1/kv/policy", "/v1/kv/inspect"] {
        assert_error(
            &post(&addr, path, &json!({"prompt": 7, "tokens": "x", "kv_policy": 7})),
            "invalid request",
            "null",
        );
    }
}

/// A chat answer ended by the model's EOS (`<|im_end|>` on SmolLM2) lists
/// the EOS last, not in the text; so `echo` + `max_tokens: 1` always has
/// prompt + 1 entries, which lm-evaluation-harness relies on.
#[test]
fn eos_is_listed_last_smollm2() {
    let path = common::shared().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let m = kvslim_models::load_model(&path).expect("load SmolLM2");
    let tok = std::sync::Arc::new(m.tokenizer.expect("tokenizer"));
    let config =
        kvslim_server::ServerConfig { policy: PolicySpec::full(), limits: limits(), model_name: "smollm2".into() };
    let state = kvslim_server::AppState::new(std::sync::Arc::new(m.model), tok.clone(), config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || kvslim_server::serve_blocking(listener, state, 2));
    let msgs = json!([{"role": "user", "content": "Say hello."}]);
    let body = json!({"messages": msgs, "max_tokens": 64, "temperature": 0, "logprobs": true, "top_logprobs": 1});
    let v = ok(&addr, "/v1/chat/completions", &body);
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "stop", "{v}");
    let content = c["logprobs"]["content"].as_array().unwrap();
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(content.len(), n + 1);
    assert_eq!(content[n]["token"].as_str(), tok.token_text(tok.eos[0]).as_deref());
    let text: Vec<u8> = content[..n]
        .iter()
        .flat_map(|e| e["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8))
        .collect();
    assert_eq!(String::from_utf8(text).unwrap(), c["message"]["content"].as_str().unwrap());
}
