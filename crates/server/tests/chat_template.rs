//! `/v1/chat/completions` through chat templates (stories260K over HTTP):
//! the rendered template is the prompt (same greedy text as posting the
//! rendered string to `/v1/completions`), `tools` reach the template with
//! their key order, a template that raises or does not parse answers 400 in
//! OpenAI's error shape, and a model without a template gets the plain
//! `role: content` fallback.

mod common;

use common::{start, start_with_chat, stories};
use kvslim_loadtest::http_client::{self, Response};
use kvslim_models::chat::{ChatFormat, ChatTemplate};
use kvslim_server::Limits;
use serde_json::{json, Value};

fn limits() -> Limits {
    Limits { kv_memory: 64 << 20, max_batch: 4, queue_limit: 16, ..Limits::default() }
}

fn post(addr: &str, path: &str, body: &Value) -> Response {
    http_client::request(addr, "POST", path, Some(&body.to_string())).unwrap()
}

fn template(text: &str) -> Option<Result<ChatFormat, String>> {
    let t = ChatTemplate::new(text, "test template", Some("<s>".into()), Some("</s>".into())).unwrap();
    Some(Ok(ChatFormat::Template(Box::new(t))))
}

const TEMPLATE: &str = "{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}\
{% for m in messages %}{{ m.role | upper }}: {{ m.content | trim }}\n{% endfor %}\
{% if add_generation_prompt %}STORY:{% endif %}";

#[test]
fn the_rendered_template_is_the_prompt() {
    let addr = start_with_chat(limits(), template(TEMPLATE));
    let tools = json!([{"type": "function", "function": {"name": "tell", "parameters": {"z": 1, "a": "ü"}}}]);
    let body = json!({
        "messages": [{"role": "user", "content": [{"type": "text", "text": " Once upon "}, {"type": "text", "text": "a time "}]}],
        "tools": tools,
        "max_tokens": 12,
        "temperature": 0,
    });
    let chat = post(&addr, "/v1/chat/completions", &body);
    assert_eq!(chat.status, 200, "{}", chat.text());
    let chat = chat.json();
    // key order as sent (z before a), Python's separators, no ASCII escaping
    let rendered = "Tools: [{\"type\": \"function\", \"function\": {\"name\": \"tell\", \"parameters\": {\"z\": 1, \"a\": \"ü\"}}}]\nUSER: Once upon a time\nSTORY:";
    let tok = stories().tokenizer.unwrap();
    assert_eq!(chat["usage"]["prompt_tokens"], tok.encode(rendered).unwrap().len());
    let plain = post(&addr, "/v1/completions", &json!({"prompt": rendered, "max_tokens": 12, "temperature": 0}));
    assert_eq!(plain.status, 200, "{}", plain.text());
    assert_eq!(chat["choices"][0]["message"]["content"], plain.json()["choices"][0]["text"]);
}

#[test]
fn a_raising_template_is_400() {
    let t = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{{ m.content }}{% endfor %}";
    let addr = start_with_chat(limits(), template(t));
    let r = post(&addr, "/v1/chat/completions", &json!({"messages": [{"role": "system", "content": "x"}]}));
    assert_eq!(r.status, 400, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["type"], "invalid_request_error");
    assert_eq!(e["param"], "messages");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("test template") && msg.contains("System role not supported"), "{msg}");
    // a valid conversation still works on the same server
    let r =
        post(&addr, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_broken_template_is_400_and_completions_still_work() {
    let err = ChatTemplate::new("{% for m in messages %}", "model.gguf (GGUF `tokenizer.chat_template`)", None, None)
        .unwrap_err()
        .to_string();
    let addr = start_with_chat(limits(), Some(Err(err)));
    let r = post(&addr, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "Hi"}]}));
    assert_eq!(r.status, 400, "{}", r.text());
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("model.gguf (GGUF `tokenizer.chat_template`) does not parse"), "{msg}");
    let r = post(&addr, "/v1/completions", &json!({"prompt": "Once", "max_tokens": 2}));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn no_template_uses_the_plain_fallback() {
    let addr = start(limits());
    let body = json!({"messages": [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": "Once"}], "max_tokens": 2});
    let r = post(&addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let tok = stories().tokenizer.unwrap();
    let want = tok.encode("system: Tell a story.\nuser: Once\nassistant:").unwrap().len();
    assert_eq!(r.json()["usage"]["prompt_tokens"], want);
}
