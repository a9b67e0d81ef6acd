//! Chat templates rendered by kvslim (minijinja) against what Hugging Face
//! transformers' `apply_chat_template` renders for the same templates and
//! conversations (`fixtures/chat_templates.json`, made by
//! `scripts/chat_template_fixtures.py`): SmolLM2 (from the GGUF), Qwen2.5
//! (default system prompt, tools), Gemma 2 (`raise_exception` on roles),
//! Llama 3.2 (`tojson(indent=4)`, date variables). Byte for byte.

mod common;

use common::shared;
use kvslim_models::chat::{json_to_value, ChatError, ChatMessage, ChatTemplate, Value};
use kvslim_models::load_model;

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    json_to_value(&text).unwrap()
}

fn get(v: &Value, key: &str) -> Value {
    v.get_attr(key).unwrap()
}

fn string(v: &Value, key: &str) -> Option<String> {
    get(v, key).as_str().map(String::from)
}

#[test]
fn renders_like_transformers() {
    let fx = fixture();
    let templates = get(&fx, "templates");
    let mut checked = 0;
    let mut raised = 0;
    for case in get(&fx, "cases").try_iter().unwrap() {
        let family = string(&case, "family").unwrap();
        let name = format!("{family} / {}", string(&case, "name").unwrap());
        let t = get(&templates, &family);
        let tmpl = ChatTemplate::new(
            &string(&t, "template").unwrap(),
            format!("fixture {family}"),
            string(&t, "bos_token"),
            string(&t, "eos_token"),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let tools = Some(get(&case, "tools")).filter(|v| !v.is_undefined());
        let extra_v = get(&case, "extra");
        let extra: Vec<(String, Value)> = if extra_v.is_undefined() {
            Vec::new()
        } else {
            extra_v.try_iter().unwrap().map(|k| (k.to_string(), extra_v.get_item(&k).unwrap())).collect()
        };
        let extra: Vec<(&str, Value)> = extra.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let got =
            tmpl.render_values(get(&case, "messages"), tools, get(&case, "add_generation_prompt").is_true(), &extra);
        match (string(&case, "expected"), string(&case, "error")) {
            (Some(want), _) => {
                let got = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(got, want, "{name}");
            }
            (None, Some(msg)) => {
                match got {
                    Err(ChatError::Raised { message, .. }) => assert_eq!(message, msg, "{name}"),
                    other => panic!("{name}: expected the template to raise `{msg}`, got {other:?}"),
                }
                raised += 1;
            }
            (None, None) => panic!("{name}: the fixture has neither `expected` nor `error`"),
        }
        checked += 1;
    }
    assert!(checked >= 50, "only {checked} cases");
    assert!(raised >= 4, "only {raised} raising cases");
}

/// The SmolLM2 template in the fixture is the one in the GGUF, its rendered
/// prompt tokenizes with `<|im_start|>`/`<|im_end|>` as single ids and
/// exactly one leading BOS (id 1 is `<|im_start|>` in this vocabulary).
#[test]
fn smollm2_gguf_template_and_tokens() {
    let path = shared().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is absent: the tests need ../shared (or KVSLIM_SHARED)", path.display());
    let loaded = load_model(&path).unwrap();
    let tok = loaded.tokenizer.as_ref().expect("embedded tokenizer");
    let fx = fixture();
    let want = string(&get(&get(&fx, "templates"), "smollm2"), "template").unwrap();
    assert_eq!(tok.chat_template.as_deref(), Some(want.as_str()), "fixture template = GGUF template");

    let tmpl = ChatTemplate::for_tokenizer(tok, None, &path.display().to_string()).unwrap().expect("a template");
    assert_eq!(tmpl.bos_token(), Some("<|im_start|>"));
    assert!(tmpl.source().contains("GGUF `tokenizer.chat_template`"), "{}", tmpl.source());
    assert_eq!(tmpl.end_of_turn_markers(), vec!["<|im_end|>".to_string()]);
    let msgs = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi")];
    let text = tmpl.render(&msgs, true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode_chat(&text, tmpl.bos_token()).unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 3, "three <|im_start|>: {ids:?}");
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2, "two <|im_end|>: {ids:?}");
    assert_eq!((ids[0], ids[1]), (1, tok.encode("system").unwrap()[0]), "one BOS, then `system`: {ids:?}");
    assert_eq!(tok.decode(&ids).unwrap(), "system\nBe brief.\nuser\nHi\nassistant\n");
}
