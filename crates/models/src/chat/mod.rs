//! Chat prompts rendered with the model's own Jinja chat template, the way
//! Hugging Face transformers' `apply_chat_template` renders them, so a chat
//! request gives the model exactly the text it was trained on.
//!
//! * Template source: GGUF `tokenizer.chat_template`, or `chat_template` in
//!   `tokenizer_config.json` (a string, or the list of named templates, of
//!   which `default` is used), or a `chat_template.jinja` file beside it.
//! * Environment as in transformers: `trim_blocks` and `lstrip_blocks` on,
//!   variables `messages`, `add_generation_prompt`, `tools` and `documents`
//!   (`none` unless given, as transformers passes them), `bos_token` and
//!   `eos_token` (strings; left undefined when the tokenizer has none),
//!   functions `raise_exception(msg)` and `strftime_now(fmt)` (UTC), a
//!   `tojson` filter that writes what Python's `json.dumps` writes, and
//!   Python string/dict methods (`.strip()`, `.startswith()`, `.items()` …)
//!   through minijinja-contrib's `pycompat`.
//! * Maps from JSON keep their key order (`tojson` of a tool schema prints its
//!   keys as given). Dict literals written inside a template come out with
//!   sorted keys, and transformers' `{% generation %}` tag is not supported.
//! * A model without a template (base models, llama2.c files) gets the plain
//!   fallback [`ChatFormat::Plain`]: one `role: content` line per message,
//!   then `assistant:`. A template that does not parse, or raises, is an
//!   error naming where the template came from.

use crate::tokenizer::Tokenizer;
/// Template values (messages, tools), re-exported so callers need no
/// minijinja dependency of their own.
pub use minijinja::Value;
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use std::fmt::{self, Write as _};
use std::path::Path;

mod python;

pub use python::{json_to_value, serde_to_value, JsonValue};
use python::{strftime, tojson_filter, OrderedMap};

/// Errors from loading or rendering a chat template. Each names where the
/// template came from, so a broken template in a model file is easy to find.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template does not parse.
    #[error("the chat template from {origin} does not parse: {message}")]
    Parse { origin: String, message: String },
    /// The template called `raise_exception` (e.g. roles out of order).
    #[error("the chat template from {origin} rejected the conversation: {message}")]
    Raised { origin: String, message: String },
    /// Any other failure while rendering (undefined operation, bad value …).
    #[error("the chat template from {origin} failed to render: {message}")]
    Render { origin: String, message: String },
    /// A conversation cannot continue a context made of its first messages.
    #[error("{0}")]
    Continuation(String),
}

/// One chat message with plain-text content: what the CLI and most API
/// requests carry. Richer messages (tool calls) go through [`json_to_value`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }

    fn to_value(&self) -> Value {
        OrderedMap::value(vec![
            (Value::from("role"), Value::from(self.role.as_str())),
            (Value::from("content"), Value::from(self.content.as_str())),
        ])
    }
}

/// Marks errors raised by the template itself through `raise_exception`.
const RAISED: &str = "raise_exception: ";

/// Well-known end-of-turn markers; those the template writes become stop
/// strings / stop ids, since a model may emit them instead of its EOS.
const END_OF_TURN: &[&str] = &["<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "</s>"];

/// A compiled chat template plus the special-token strings it may print.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    text: String,
    bos: Option<String>,
    eos: Option<String>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate").field("source", &self.source).field("bos", &self.bos).finish()
    }
}

impl ChatTemplate {
    /// Compiles `text`; `source` says where it came from (for error messages),
    /// `bos`/`eos` are the strings `bos_token`/`eos_token` render to.
    pub fn new(
        text: &str,
        source: impl Into<String>,
        bos: Option<String>,
        eos: Option<String>,
    ) -> Result<Self, ChatError> {
        let source = source.into();
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatError::Parse { origin: source.clone(), message: describe(&e) })?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson_filter);
        env.add_function("raise_exception", |msg: Value| -> Result<Value, JinjaError> {
            let msg = msg.as_str().map_or_else(|| msg.to_string(), String::from);
            Err(JinjaError::new(ErrorKind::InvalidOperation, format!("{RAISED}{msg}")))
        });
        env.add_function("strftime_now", |fmt: String| -> Result<Value, JinjaError> {
            let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            Ok(Value::from(strftime(&fmt, secs as i64)))
        });
        env.add_template_owned("chat_template", text.to_string())
            .map_err(|e| ChatError::Parse { origin: source.clone(), message: describe(&e) })?;
        Ok(ChatTemplate { env, source, text: text.to_string(), bos, eos })
    }

    /// The model's template, or `None` when it has none. `tokenizer_config`
    /// is the `tokenizer_config.json` the tokenizer came with (HF models):
    /// its `bos_token`/`eos_token` strings win over the ids' text, as in
    /// transformers. `origin` names the model file for error messages.
    pub fn for_tokenizer(
        tok: &Tokenizer,
        tokenizer_config: Option<&Path>,
        origin: &str,
    ) -> Result<Option<Self>, ChatError> {
        let Some(text) = tok.chat_template.as_deref() else {
            return Ok(None);
        };
        let config = tokenizer_config
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        let token = |key: &str| -> Option<String> {
            let v = config.as_ref()?.get(key)?;
            v.as_str().or_else(|| v.get("content").and_then(|c| c.as_str())).map(String::from)
        };
        let source = match tokenizer_config {
            Some(p) if config.is_some() => format!("{} (`chat_template`)", p.display()),
            _ => format!("{origin} (GGUF `tokenizer.chat_template`)"),
        };
        let bos = token("bos_token").or_else(|| tok.bos.and_then(|id| tok.token_text(id)));
        let eos = token("eos_token").or_else(|| tok.eos.first().and_then(|&id| tok.token_text(id)));
        Self::new(text, source, bos, eos).map(Some)
    }

    /// Where the template came from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The string `bos_token` renders to.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos.as_deref()
    }

    /// End-of-turn markers the template writes (plus the EOS string): stop
    /// strings for a reply.
    pub fn end_of_turn_markers(&self) -> Vec<String> {
        let mut v: Vec<String> =
            END_OF_TURN.iter().filter(|m| self.text.contains(**m)).map(|m| m.to_string()).collect();
        if let Some(e) = &self.eos {
            if !e.is_empty() && !v.contains(e) {
                v.push(e.clone());
            }
        }
        v
    }

    /// Renders plain-text messages.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, ChatError> {
        let msgs: Value = messages.iter().map(ChatMessage::to_value).collect();
        self.render_values(msgs, None, add_generation_prompt, &[])
    }

    /// Renders any message list (e.g. from [`json_to_value`], with tool
    /// calls), optional `tools`, and extra template variables (transformers'
    /// `**kwargs`, e.g. `date_string`), which override the defaults.
    pub fn render_values(
        &self,
        messages: Value,
        tools: Option<Value>,
        add_generation_prompt: bool,
        extra: &[(&str, Value)],
    ) -> Result<String, ChatError> {
        let mut ctx: Vec<(Value, Value)> = vec![
            ("messages".into(), messages),
            ("tools".into(), tools.unwrap_or(Value::from(()))),
            ("documents".into(), Value::from(())),
            ("add_generation_prompt".into(), Value::from(add_generation_prompt)),
        ];
        if let Some(b) = &self.bos {
            ctx.push(("bos_token".into(), Value::from(b.as_str())));
        }
        if let Some(e) = &self.eos {
            ctx.push(("eos_token".into(), Value::from(e.as_str())));
        }
        for (k, v) in extra {
            let key = Value::from(*k);
            ctx.retain(|(old, _)| *old != key);
            ctx.push((key, v.clone()));
        }
        let tmpl = self
            .env
            .get_template("chat_template")
            .map_err(|e| ChatError::Render { origin: self.source.clone(), message: describe(&e) })?;
        tmpl.render(OrderedMap::value(ctx)).map_err(|e| match raised(&e) {
            Some(message) => ChatError::Raised { origin: self.source.clone(), message },
            None => ChatError::Render { origin: self.source.clone(), message: describe(&e) },
        })
    }
}

/// How a model's chat is turned into a prompt: its own template, or, for a
/// model without one (base models, llama2.c files), the documented plain
/// fallback — one `role: content` line per message, then `assistant:` —
/// so chat endpoints still answer for any model.
#[derive(Debug)]
pub enum ChatFormat {
    Template(Box<ChatTemplate>),
    Plain,
}

impl ChatFormat {
    /// The tokenizer's template (see [`ChatTemplate::for_tokenizer`]), else [`ChatFormat::Plain`].
    pub fn for_tokenizer(tok: &Tokenizer, tokenizer_config: Option<&Path>, origin: &str) -> Result<Self, ChatError> {
        Ok(match ChatTemplate::for_tokenizer(tok, tokenizer_config, origin)? {
            Some(t) => ChatFormat::Template(Box::new(t)),
            None => ChatFormat::Plain,
        })
    }

    /// Renders messages (a list of maps with `role` and `content`) ending
    /// where the assistant's reply starts.
    pub fn render(&self, messages: Value, tools: Option<Value>) -> Result<String, ChatError> {
        match self {
            ChatFormat::Template(t) => t.render_values(messages, tools, true, &[]),
            ChatFormat::Plain => {
                let mut s = String::new();
                for m in messages.try_iter().into_iter().flatten() {
                    let field = |k: &str| m.get_attr(k).ok().filter(|v| !v.is_none() && !v.is_undefined());
                    let role = field("role").map(|v| v.to_string()).unwrap_or_default();
                    let content = field("content").map(|v| v.to_string()).unwrap_or_default();
                    let _ = writeln!(s, "{role}: {content}");
                }
                s.push_str("assistant:");
                Ok(s)
            }
        }
    }

    /// [`ChatFormat::render`] for plain-text messages.
    pub fn render_messages(&self, messages: &[ChatMessage]) -> Result<String, ChatError> {
        self.render(messages.iter().map(ChatMessage::to_value).collect(), None)
    }

    /// Tokenizes a rendered prompt (special tokens as single ids, one BOS).
    pub fn encode(&self, tok: &Tokenizer, text: &str) -> crate::Result<Vec<u32>> {
        match self {
            ChatFormat::Template(t) => tok.encode_chat(text, t.bos_token()),
            ChatFormat::Plain => tok.encode(text),
        }
    }

    /// The tokens that continue a conversation whose first messages,
    /// `earlier` (rendered without the reply's opening), are already in a
    /// cache: the whole conversation `earlier + later` rendered up to the
    /// reply, minus the rendering of `earlier`. A compressed context made
    /// of a chat's first messages is asked this way. Errors when the
    /// template does not render the longer conversation as an extension
    /// of the shorter one.
    pub fn continuation(
        &self,
        tok: &Tokenizer,
        earlier: &[ChatMessage],
        later: &[ChatMessage],
    ) -> Result<Vec<u32>, ChatError> {
        let head = self.render_prefix(earlier)?;
        let all: Vec<ChatMessage> = earlier.iter().chain(later).cloned().collect();
        let whole = self.render_messages(&all)?;
        let Some(tail) = whole.strip_prefix(head.as_str()) else {
            return Err(ChatError::Continuation(
                "the chat template does not render the conversation as a continuation of the context's messages".into(),
            ));
        };
        tok.encode_after(tail).map_err(|e| ChatError::Continuation(e.to_string()))
    }

    /// Renders messages as they stand, without opening a reply: the text of
    /// a context made of a conversation's first messages.
    pub fn render_prefix(&self, messages: &[ChatMessage]) -> Result<String, ChatError> {
        match self {
            ChatFormat::Template(t) => t.render(messages, false),
            ChatFormat::Plain => {
                let mut s = String::new();
                for m in messages {
                    let _ = writeln!(s, "{}: {}", m.role, m.content);
                }
                Ok(s)
            }
        }
    }

    /// Cuts a finished reply at its earliest stop string (an end-of-turn
    /// marker that is not one token ends the reply, and is not part of it).
    pub fn cut_at_stop(&self, reply: &mut String) {
        if let Some(cut) = self.stops().iter().filter_map(|s| reply.find(s.as_str())).min() {
            reply.truncate(cut);
        }
    }

    /// Stop strings for a reply (the template's end-of-turn markers).
    pub fn stops(&self) -> Vec<String> {
        match self {
            ChatFormat::Template(t) => t.end_of_turn_markers(),
            ChatFormat::Plain => Vec::new(),
        }
    }

    /// Ids that end a reply: the tokenizer's EOS plus end-of-turn markers
    /// that are single tokens (`<end_of_turn>` when EOS is `<eos>` …).
    pub fn stop_ids(&self, tok: &Tokenizer) -> Vec<u32> {
        let mut ids = tok.eos.clone();
        for m in self.stops() {
            if let Ok(mut v) = tok.encode(&m) {
                if v.len() == 2 && tok.bos == Some(v[0]) {
                    v.remove(0); // BOS added by the pipeline
                }
                if let [id] = v[..] {
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
            }
        }
        ids
    }
}

/// The `raise_exception` message inside a render error, if that is what it is.
fn raised(e: &JinjaError) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(j) = err.downcast_ref::<JinjaError>() {
            if let Some(m) = j.detail().and_then(|d| d.strip_prefix(RAISED)) {
                return Some(m.to_string());
            }
        }
        cur = err.source();
    }
    None
}

/// A one-line error with the template line when known.
fn describe(e: &JinjaError) -> String {
    let mut s = match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        let _ = write!(s, " (line {line})");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpl(text: &str) -> ChatTemplate {
        ChatTemplate::new(text, "test", Some("<s>".into()), Some("</s>".into())).unwrap()
    }

    fn one(text: &str) -> String {
        tmpl(text).render(&[ChatMessage::new("user", "hi")], true).unwrap()
    }

    #[test]
    fn blocks_are_trimmed_like_transformers() {
        // booleans print as Python does (`True`); trim_blocks eats the newline after a tag, lstrip_blocks the indent before it
        let t = "{% for m in messages %}\n    {% if true %}\n[{{ m.role }}]\n    {% endif %}\n{% endfor %}\n";
        assert_eq!(one(t), "[user]\n");
    }

    #[test]
    fn special_tokens_and_variables() {
        assert_eq!(one("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}"), "<s>|</s>|True");
        assert_eq!(one("{{ tools is none }} {{ documents is none }} {{ tools is defined }}"), "True True True");
        let no_bos = ChatTemplate::new("[{{ bos_token }}]", "t", None, None).unwrap();
        assert_eq!(no_bos.render(&[], false).unwrap(), "[]");
    }

    #[test]
    fn raise_exception_is_a_clear_error() {
        let e = tmpl("{{ raise_exception('roles must alternate') }}").render(&[], true).unwrap_err();
        assert!(matches!(&e, ChatError::Raised { message, .. } if message == "roles must alternate"), "{e:?}");
        assert!(e.to_string().contains("from test rejected the conversation: roles must alternate"), "{e}");
    }

    #[test]
    fn parse_errors_name_the_source() {
        let e = ChatTemplate::new("{% for m in messages %}", "model.gguf (GGUF `tokenizer.chat_template`)", None, None)
            .unwrap_err();
        assert!(matches!(e, ChatError::Parse { .. }));
        assert!(e.to_string().contains("model.gguf (GGUF `tokenizer.chat_template`) does not parse"), "{e}");
        let e = tmpl("{{ messages[0].content.nope() }}").render(&[ChatMessage::new("u", "x")], true).unwrap_err();
        assert!(matches!(e, ChatError::Render { .. }), "{e:?}");
    }

    #[test]
    fn python_string_methods() {
        let t = "{{ '  Hi  '.strip() }}|{{ 'abc'.startswith('ab') }}|{{ 'a,b'.split(',') | length }}|{{ 'x'.upper() }}";
        assert_eq!(one(t), "Hi|True|2|X");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let v = json_to_value(r#"{"b": 1, "a": [1.5, 2.0, true, null, "é<\"\n"], "c": {}, "d": 1e-7}"#).unwrap();
        let t = tmpl("{{ tools | tojson }}");
        let render = |t: &ChatTemplate| t.render_values(Value::from(Vec::<Value>::new()), Some(v.clone()), false, &[]);
        assert_eq!(render(&t).unwrap(), r#"{"b": 1, "a": [1.5, 2.0, true, null, "é<\"\n"], "c": {}, "d": 1e-07}"#);
        let t = tmpl("{{ tools | tojson(indent=2, sort_keys=true) }}");
        assert_eq!(
            render(&t).unwrap(),
            "{\n  \"a\": [\n    1.5,\n    2.0,\n    true,\n    null,\n    \"é<\\\"\\n\"\n  ],\n  \"b\": 1,\n  \"c\": {},\n  \"d\": 1e-07\n}"
        );
        let t = tmpl("{{ tools.a[4] | tojson(ensure_ascii=true) }}");
        assert_eq!(render(&t).unwrap(), r#""\u00e9<\"\n""#);
    }

    #[test]
    fn strftime_now_renders_utc_now() {
        let now = one("{{ strftime_now('%Y') }}");
        assert!(now.len() == 4 && now.as_str() >= "2024", "{now}");
    }

    #[test]
    fn end_of_turn_markers_from_the_template() {
        let t = ChatTemplate::new("<|im_start|>{{ x }}<|im_end|>", "t", None, Some("<|endoftext|>".into())).unwrap();
        assert_eq!(t.end_of_turn_markers(), vec!["<|im_end|>".to_string(), "<|endoftext|>".to_string()]);
    }

    #[test]
    fn plain_fallback() {
        let msgs = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi")];
        assert_eq!(ChatFormat::Plain.render_messages(&msgs).unwrap(), "system: Be brief.\nuser: Hi\nassistant:");
        assert!(ChatFormat::Plain.stops().is_empty());
    }

    #[test]
    fn loop_controls_and_namespaces() {
        let t = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}";
        let msgs = [ChatMessage::new("a", "1"), ChatMessage::new("b", "2"), ChatMessage::new("c", "3")];
        assert_eq!(tmpl(t).render(&msgs, false).unwrap(), "2");
    }
}
