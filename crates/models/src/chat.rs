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
use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Rest, ValueKind};
/// Template values (messages, tools), re-exported so callers need no
/// minijinja dependency of their own.
pub use minijinja::Value;
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use std::fmt::{self, Write as _};
use std::path::Path;
use std::sync::Arc;

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

/// A map that keeps insertion order (JSON objects, the render context):
/// minijinja's own maps sort their keys unless built with `preserve_order`.
#[derive(Debug)]
struct OrderedMap(Vec<(Value, Value)>);

impl OrderedMap {
    fn value(entries: Vec<(Value, Value)>) -> Value {
        Value::from_object(OrderedMap(entries))
    }
}

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.0.iter().map(|(k, _)| k.clone()).collect())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// Parses JSON into a template value, keeping object key order, so `tojson`
/// of a request's tool schema prints keys as the client sent them.
pub fn json_to_value(json: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str::<JsonValue>(json).map(|v| v.0)
}

/// Converts an already parsed `serde_json::Value` (key order as parsed).
pub fn serde_to_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => number_value(n),
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => a.iter().map(serde_to_value).collect(),
        J::Object(o) => {
            OrderedMap::value(o.iter().map(|(k, v)| (Value::from(k.as_str()), serde_to_value(v))).collect())
        }
    }
}

fn number_value(n: &serde_json::Number) -> Value {
    if let Some(i) = n.as_i64() {
        Value::from(i)
    } else if let Some(u) = n.as_u64() {
        Value::from(u)
    } else {
        Value::from(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// A template value deserialized straight from JSON (order-preserving).
pub struct JsonValue(pub Value);

impl<'de> serde::Deserialize<'de> for JsonValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = JsonValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, b: bool) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(b)))
            }
            fn visit_i64<E>(self, i: i64) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(i)))
            }
            fn visit_u64<E>(self, u: u64) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(u)))
            }
            fn visit_f64<E>(self, x: f64) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(x)))
            }
            fn visit_str<E>(self, s: &str) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(s)))
            }
            fn visit_string<E>(self, s: String) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(s)))
            }
            fn visit_unit<E>(self) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(())))
            }
            fn visit_none<E>(self) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(())))
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<JsonValue, D::Error> {
                serde::Deserialize::deserialize(d)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<JsonValue, A::Error> {
                let mut v = Vec::new();
                while let Some(JsonValue(x)) = a.next_element()? {
                    v.push(x);
                }
                Ok(JsonValue(Value::from(v)))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<JsonValue, A::Error> {
                let mut v: Vec<(Value, Value)> = Vec::new();
                while let Some((k, JsonValue(x))) = a.next_entry::<String, JsonValue>()? {
                    let k = Value::from(k);
                    match v.iter_mut().find(|(old, _)| *old == k) {
                        Some(slot) => slot.1 = x, // duplicate key: the last wins, as in Python
                        None => v.push((k, x)),
                    }
                }
                Ok(JsonValue(OrderedMap::value(v)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `tojson` as transformers defines it: Python's `json.dumps` with
/// `ensure_ascii=False` by default, `indent`, `separators`, `sort_keys`, and
/// no HTML escaping (minijinja's own `tojson` escapes `<`, `>`, `&`, `'`).
fn tojson_filter(value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let bad = |m: &str| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {m}"));
    // positional order as json.dumps' keywords in transformers' signature
    let pos = |i: usize| args.0.get(i).cloned();
    let ensure_ascii: bool =
        kwargs.get::<Option<bool>>("ensure_ascii")?.or(pos(0).map(|v| v.is_true())).unwrap_or(false);
    let indent_v: Option<Value> = kwargs.get::<Option<Value>>("indent")?.or(pos(1));
    let separators: Option<Value> = kwargs.get::<Option<Value>>("separators")?.or(pos(2));
    let sort_keys: bool = kwargs.get::<Option<bool>>("sort_keys")?.or(pos(3).map(|v| v.is_true())).unwrap_or(false);
    kwargs.assert_all_used()?;
    let indent = match indent_v {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (_, Some(s)) => Some(s.to_string()),
            _ => return Err(bad("indent must be an integer or a string")),
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() && !s.is_undefined() => {
            let parts: Vec<Value> = s.try_iter()?.collect();
            match (parts.first().and_then(|p| p.as_str()), parts.get(1).and_then(|p| p.as_str())) {
                (Some(a), Some(b)) if parts.len() == 2 => (a.to_string(), b.to_string()),
                _ => return Err(bad("separators must be two strings")),
            }
        }
        _ => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
    };
    let opts = JsonOpts { indent, item_sep, key_sep, sort_keys, ensure_ascii };
    let mut out = String::new();
    write_json(&mut out, &value, &opts, 0)?;
    Ok(Value::from(out))
}

struct JsonOpts {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

fn newline(out: &mut String, opts: &JsonOpts, depth: usize) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn write_json(out: &mut String, v: &Value, opts: &JsonOpts, depth: usize) -> Result<(), JinjaError> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Undefined => {
            return Err(JinjaError::new(ErrorKind::InvalidOperation, "tojson: an undefined value is not JSON"))
        }
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let x = f64::try_from(v.clone())?;
                out.push_str(&python_float(x));
            }
        }
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or(""), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, opts, depth + 1);
                write_json(out, item, opts, depth + 1)?;
            }
            newline(out, opts, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, opts, depth + 1);
                // Python turns int/float/bool/None keys into strings
                match k.as_str() {
                    Some(s) => write_json_str(out, s, opts.ensure_ascii),
                    None if k.is_none() => out.push_str("\"null\""),
                    None => write_json_str(out, &k.to_string(), opts.ensure_ascii),
                }
                out.push_str(&opts.key_sep);
                write_json(out, &v.get_item(k)?, opts, depth + 1)?;
            }
            newline(out, opts, depth);
            out.push('}');
        }
        _ => {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {} value is not JSON serializable", v.kind()),
            ))
        }
    }
    Ok(())
}

/// A JSON string literal as Python's `json.dumps` escapes it.
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `repr(float)` in Python: shortest round-trip digits, `1.0` for whole
/// numbers, exponent form below 1e-4 and from 1e16, `NaN`/`Infinity` as
/// `json.dumps` writes them.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let a = x.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Rust: 1e-5, 1.5e20 → Python: 1e-05, 1.5e+20
        let s = format!("{x:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exp.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exp),
        };
        return format!("{mant}e{sign}{digits:0>2}");
    }
    let s = format!("{x}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// Python's `strftime` for the common directives, in UTC (the machine's
/// time zone is not looked up). Unknown directives are kept as written.
fn strftime(fmt: &str, unix: i64) -> String {
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix.div_euclid(86400);
    let secs = unix.rem_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match it.next() {
            Some('Y') => write!(out, "{y}"),
            Some('y') => write!(out, "{:02}", y.rem_euclid(100)),
            Some('m') => write!(out, "{m:02}"),
            Some('d') => write!(out, "{d:02}"),
            Some('e') => write!(out, "{d:2}"),
            Some('j') => write!(out, "{yday:03}"),
            Some('H') => write!(out, "{hh:02}"),
            Some('I') => write!(out, "{:02}", if hh % 12 == 0 { 12 } else { hh % 12 }),
            Some('p') => write!(out, "{}", if hh < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{mm:02}"),
            Some('S') => write!(out, "{ss:02}"),
            Some('B') => write!(out, "{}", MONTHS[m as usize - 1]),
            Some('b') | Some('h') => write!(out, "{}", &MONTHS[m as usize - 1][..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('u') => write!(out, "{}", weekday + 1),
            Some('w') => write!(out, "{}", (weekday + 1) % 7),
            Some('F') => write!(out, "{y}-{m:02}-{d:02}"),
            Some('T') => write!(out, "{hh:02}:{mm:02}:{ss:02}"),
            Some('Z') => write!(out, "UTC"),
            Some('z') => write!(out, "+0000"),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// (year, month, day) → days since 1970-01-01.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
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
        assert_eq!(python_float(1e16), "1e+16");
        assert_eq!(python_float(123.25), "123.25");
        assert_eq!(python_float(-0.0001), "-0.0001");
    }

    #[test]
    fn strftime_known_dates() {
        // 2024-07-26 13:05:09 UTC was a Friday
        let t = days_from_civil(2024, 7, 26) * 86400 + 13 * 3600 + 5 * 60 + 9;
        let s = strftime("%d %b %Y|%A %H:%M:%S|%j|%y %B %a %I%p %e %%|%q", t);
        assert_eq!(s, "26 Jul 2024|Friday 13:05:09|208|24 July Fri 01PM 26 %|%q");
        assert_eq!(strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
        assert_eq!(strftime("%F %j %A", 951_782_400), "2000-02-29 060 Tuesday");
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
