//! Compressed contexts through the server: `POST /v1/contexts` makes one,
//! `"context": ID` answers on forks of it exactly as the engine's
//! in-memory context and a file loaded from `--contexts-dir` do (same
//! greedy text), concurrent questions share the context's pages, unused
//! contexts are listed, read and deleted, and a bad file in the folder is
//! refused without stopping the server.

mod common;

use common::{metric, shared, start, stories};
use kvslim_cache::PolicySpec;
use kvslim_engine::context::Context;
use kvslim_engine::{GenerateOptions, SamplingParams};
use kvslim_loadtest::http_client::{self, Response};
use kvslim_server::Limits;
use serde_json::{json, Value};

const POLICY: &str = "h2o:heavy=25%,recent=12.5%";
const QUESTION: &str = " Then Lily said";

fn post(addr: &str, path: &str, body: &Value) -> Response {
    http_client::request(addr, "POST", path, Some(&body.to_string())).unwrap()
}

fn document() -> String {
    let t = std::fs::read_to_string(shared().join("data/tinystories/tinystories_val.txt")).unwrap();
    t.chars().take(900).collect()
}

/// The greedy answer of the engine's own in-memory context, as the server
/// stores it (paged with the server's default page size).
fn engine_answer(max_tokens: usize) -> String {
    let m = stories();
    let tok = m.tokenizer.unwrap();
    let mut policy = PolicySpec::parse(POLICY).unwrap();
    policy.storage.page_size = Some(16);
    let ctx = Context::compress(&m.model, &policy, &tok.encode(&document()).unwrap()).unwrap();
    let q = ctx
        .question_tokens(
            &tok,
            &kvslim_models::chat::ChatFormat::Plain,
            kvslim_engine::context::Question::Text(QUESTION),
        )
        .unwrap();
    let opts = GenerateOptions { max_tokens, sampling: SamplingParams::default(), policy, eos: tok.eos.clone() };
    let g = ctx.generate(&m.model, &q, &opts, |_| true).unwrap();
    tok.decode(&g.token_ids).unwrap()
}

fn ask(addr: &str, id: &str) -> Value {
    let r =
        post(addr, "/v1/completions", &json!({"context": id, "prompt": QUESTION, "max_tokens": 12, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn a_context_answers_as_the_engine_does_and_shares_its_pages() {
    let addr = start(Limits::default());
    let r = post(&addr, "/v1/contexts", &json!({"text": document(), "kv_policy": POLICY}));
    assert_eq!(r.status, 200, "{}", r.text());
    let made = r.json();
    let id = made["id"].as_str().unwrap().to_string();
    assert!(made["tokens"].as_u64().unwrap() > 100, "{made}");
    assert!(made["kv_bytes"].as_u64().unwrap() < made["kv_bytes_full"].as_u64().unwrap() / 2, "{made}");
    assert!(made["policy"].as_str().unwrap().contains("page=16"), "contexts are paged: {made}");

    let a = ask(&addr, &id);
    assert_eq!(
        a["choices"][0]["text"].as_str().unwrap(),
        engine_answer(12),
        "the server's fork answers as the engine's"
    );
    assert_eq!(a["usage"]["prompt_tokens_reused"], made["tokens"]);
    assert_eq!(ask(&addr, &id)["choices"][0]["text"], a["choices"][0]["text"]);

    // four at once: one context plus four tails
    let context_bytes = metric(&addr, "kvslim_context_kv_bytes");
    assert!(context_bytes > 0.0);
    let threads: Vec<_> =
        (0..4).map(|_| (addr.clone(), id.clone())).map(|(a, i)| std::thread::spawn(move || ask(&a, &i))).collect();
    for t in threads {
        assert_eq!(t.join().unwrap()["choices"][0]["text"], a["choices"][0]["text"]);
    }
    assert_eq!(metric(&addr, "kvslim_context_requests_total"), 6.0);
    assert_eq!(metric(&addr, "kvslim_kv_bytes_in_use"), context_bytes, "only the context stays reserved");

    // list, read, delete
    let list = http_client::request(&addr, "GET", "/v1/contexts", None).unwrap().json();
    assert_eq!(list["data"][0]["id"], id.as_str());
    assert_eq!(
        http_client::request(&addr, "GET", &format!("/v1/contexts/{id}"), None).unwrap().json()["tokens"],
        made["tokens"]
    );
    assert_eq!(http_client::request(&addr, "DELETE", &format!("/v1/contexts/{id}"), None).unwrap().status, 200);
    assert_eq!(http_client::request(&addr, "GET", &format!("/v1/contexts/{id}"), None).unwrap().status, 404);
    let gone = post(&addr, "/v1/completions", &json!({"context": id, "prompt": "x"}));
    assert_eq!(gone.status, 404, "{}", gone.text());
    assert_eq!(metric(&addr, "kvslim_kv_bytes_in_use"), 0.0);

    // requests that cannot be contexts'
    for (body, want) in [
        (json!({"context": "ctx-00", "prompt": "x", "kv_policy": "full"}), 404),
        (json!({"text": ""}), 400),
        (json!({"messages": []}), 400),
        (json!({"text": "a", "kv_policy": "nonsense"}), 400),
    ] {
        let path = if body.get("context").is_some() { "/v1/completions" } else { "/v1/contexts" };
        assert_eq!(post(&addr, path, &body).status, want, "{body}");
    }
}

#[test]
fn contexts_dir_keeps_them_across_restarts_and_refuses_bad_files() {
    let dir = std::env::temp_dir().join(format!("kvslim-ctxdir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ctx-00000000000000ba.kvctx"), b"KVSLIMCX but not really").unwrap();
    let limits = || Limits { contexts_dir: Some(dir.clone()), ..Limits::default() };
    let addr = start(limits());
    let made = post(&addr, "/v1/contexts", &json!({"text": document(), "kv_policy": POLICY})).json();
    let id = made["id"].as_str().unwrap().to_string();
    assert!(dir.join(format!("{id}.kvctx")).is_file());
    let first = ask(&addr, &id);
    // a second server on the same folder (a restart, or a replica)
    let again = start(limits());
    assert_eq!(ask(&again, &id)["choices"][0]["text"], first["choices"][0]["text"]);
    let bad = post(&again, "/v1/completions", &json!({"context": "ctx-00000000000000ba", "prompt": "x"}));
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert!(bad.text().contains("ctx-00000000000000ba"), "{}", bad.text());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `auto` in `POST /v1/contexts` becomes the context rows' choice for the
/// model, as the engine resolves it (`Model::context_policy`), paged as the
/// server's contexts are; the context reports that spec, not `auto`.
#[test]
fn auto_makes_a_context_under_the_context_rows_choice() {
    let addr = start(Limits::default());
    let made = post(&addr, "/v1/contexts", &json!({"text": document(), "kv_policy": "auto:budget=25%"})).json();
    let m = stories();
    let n = m.tokenizer.unwrap().encode(&document()).unwrap().len();
    let mut auto = PolicySpec::parse("auto:budget=25%").unwrap();
    auto.storage.page_size = Some(16);
    let want = m.model.context_policy(&auto, n);
    assert!(want.auto.is_none());
    assert_eq!(made["policy"].as_str().unwrap(), want.to_string(), "{made}");
}
