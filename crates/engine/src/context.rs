//! Compress once, ask many: a text prefilled once under a policy, kept
//! compressed, and continued on a fork for each question. The question's
//! tokens go into the fork as decode steps, so the policy keeps running
//! (scoring and evicting one token per step) while the question and the
//! answer go in (under `full`, which evicts nothing, as one prefill chunk);
//! the context itself never changes. A context saves to a
//! file and loads back bit for bit ([`Context::save`], [`Context::load`]).
//!
//! # File format (version 1)
//!
//! ```text
//! 8 bytes   magic "KVSLIMCX"
//! u32       format version
//! u64       header length, then the header: JSON {model, policy, tokens, base_len, kvslim, meta}
//! u64       cache length, then the cache ([`SequenceCache::save`]: the kept K/V rows
//!           in their storage dtype, positions, scores, policy state, counters)
//! u32       CRC-32 of every byte before it
//! ```
//!
//! All integers are little-endian. `model` is [`Model::fingerprint`]:
//! a file only loads into the model that made it. The file is read whole
//! and its rows copied into the store (which owns aligned row buffers or a
//! page pool), so memory-mapping it would save nothing: the read is one
//! sequential pass (a 4.4 MiB context loaded in 0.02 s, `kvslim generate
//! --context`).

use crate::generate::{check_fits, new_token_limit_at, prefill_shared, GenerateOptions, Generation};
use crate::lockstep::{self, Lockstep};
use crate::session::Session;
use crate::{EngineError, Result};
use kvslim_cache::policy::TokenPolicySpec;
use kvslim_cache::{KvBytes, PagePool, PolicySpec, SequenceCache};
use kvslim_models::chat::{ChatFormat, ChatMessage};
use kvslim_models::{Logits, Model, Tokenizer};
use std::path::Path;
use std::time::Instant;

/// The first bytes of a saved context.
pub const MAGIC: &[u8; 8] = b"KVSLIMCX";
/// The format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Chooses a loaded context's storage: may give its policy a page size and
/// returns the page pool to draw from ([`Context::from_bytes_in`]).
pub type PoolFor<'a> = dyn Fn(&mut PolicySpec) -> Option<PagePool> + 'a;

/// A compressed context: the text's tokens, the policy it was compressed
/// under and the cache that policy kept.
#[derive(Clone)]
pub struct Context {
    tokens: Vec<u32>,
    policy: PolicySpec,
    cache: SequenceCache,
    fingerprint: String,
    /// What the caller wants kept with the context (how its text was
    /// made: the chat messages it renders, a name), saved in the header.
    meta: serde_json::Value,
}

/// The header of a saved context.
#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    /// [`Model::fingerprint`] of the model that made it.
    model: String,
    /// The policy spec as written ([`PolicySpec`]'s display form).
    policy: String,
    tokens: Vec<u32>,
    /// What percentage budgets resolved against (the context's length).
    base_len: usize,
    /// The kvslim version that wrote it (informational).
    kvslim: String,
    /// The caller's metadata ([`Context::meta`]).
    #[serde(default)]
    meta: serde_json::Value,
}

/// How a context's text was made, so that questions can follow it: plain
/// text (a question's text is tokenized and appended), or the first
/// messages of a chat (a question is the next user turn, rendered by the
/// model's chat template). Kept in [`Context::meta`] as `{"framing": …}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Framing {
    Text(String),
    Chat(Vec<ChatMessage>),
}

/// What is asked of a context.
pub enum Question<'a> {
    /// Text that follows the context directly (a chat context: one user turn).
    Text(&'a str),
    /// Chat messages after the context's (a text context: rendered whole after it).
    Messages(&'a [ChatMessage]),
}

impl Framing {
    /// The tokens of the context's text: the text as encoded, or the
    /// messages rendered without opening a reply.
    pub fn encode(&self, tok: &Tokenizer, chat: &ChatFormat) -> Result<Vec<u32>> {
        let request = |e: String| EngineError::Request(e);
        match self {
            Framing::Text(t) => Ok(tok.encode(t)?),
            Framing::Chat(m) => {
                let text = chat.render_prefix(m).map_err(|e| request(e.to_string()))?;
                Ok(chat.encode(tok, &text)?)
            }
        }
    }

    /// The [`Context::meta`] a context of this framing carries.
    pub fn meta(&self) -> serde_json::Value {
        serde_json::json!({ "framing": self.to_json() })
    }

    fn to_json(&self) -> serde_json::Value {
        match self {
            Framing::Text(_) => serde_json::json!({ "kind": "text" }),
            Framing::Chat(m) => serde_json::json!({
                "kind": "chat",
                "messages": m.iter().map(|m| serde_json::json!({ "role": m.role, "content": m.content })).collect::<Vec<_>>(),
            }),
        }
    }

    /// The framing kept in a context's meta (`None`: plain text or none).
    fn from_meta(meta: &serde_json::Value) -> Option<Vec<ChatMessage>> {
        let f = meta.get("framing")?;
        (f.get("kind")?.as_str()? == "chat").then(|| {
            f.get("messages")
                .and_then(|m| m.as_array())
                .map(|ms| {
                    ms.iter()
                        .map(|m| {
                            let s = |k: &str| m.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
                            ChatMessage::new(s("role"), s("content"))
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
    }
}

impl Context {
    /// Compresses a text or the first messages of a chat (see [`Framing`]);
    /// the framing is kept in the context's meta, so questions can follow
    /// it ([`Context::question_tokens`]).
    pub fn compress_framed(
        model: &Model,
        policy: &PolicySpec,
        tok: &Tokenizer,
        chat: &ChatFormat,
        framing: &Framing,
    ) -> Result<Context> {
        let tokens = framing.encode(tok, chat)?;
        let ctx = Self::compress(model, policy, &tokens)?;
        Ok(ctx.with_meta(framing.meta()))
    }

    /// A context from a cache that has just been fed exactly `tokens`
    /// under `policy` from empty, as [`Context::compress`] feeds them (a
    /// server prefills in slices between decode steps, bit for bit the same).
    pub fn from_prefilled(model: &Model, policy: PolicySpec, tokens: Vec<u32>, cache: SequenceCache) -> Result<Self> {
        if cache.next_pos() != tokens.len() || tokens.is_empty() {
            return Err(EngineError::Request(format!(
                "a context of {} tokens from a cache that has seen {}",
                tokens.len(),
                cache.next_pos()
            )));
        }
        Ok(Context { tokens, policy, cache, fingerprint: model.fingerprint(), meta: serde_json::Value::Null })
    }

    /// The tokens that put `question` after this context: a chat
    /// context's next turns rendered by the template as a continuation of
    /// its messages; after plain text, the question's text, or its
    /// messages rendered whole. No BOS: the context has it.
    pub fn question_tokens(&self, tok: &Tokenizer, chat: &ChatFormat, question: Question<'_>) -> Result<Vec<u32>> {
        let request = |e: String| EngineError::Request(e);
        let ids = match (Framing::from_meta(&self.meta), question) {
            (Some(earlier), Question::Text(t)) => {
                chat.continuation(tok, &earlier, &[ChatMessage::new("user", t)]).map_err(|e| request(e.to_string()))?
            }
            (Some(earlier), Question::Messages(m)) => {
                chat.continuation(tok, &earlier, m).map_err(|e| request(e.to_string()))?
            }
            (None, Question::Text(t)) => tok.encode_after(t)?,
            (None, Question::Messages(m)) => {
                let text = chat.render_messages(m).map_err(|e| request(e.to_string()))?;
                let mut ids = chat.encode(tok, &text)?;
                tok.strip_bos(&mut ids); // the context has the sequence's BOS already
                ids
            }
        };
        if ids.is_empty() {
            return Err(request("the question is empty".into()));
        }
        Ok(ids)
    }

    /// Prefills `tokens` under `policy` into an empty cache: the policy's
    /// prefill rule chooses what stays (percentage budgets resolve against
    /// the context's length), before any question is known. `auto`
    /// becomes the context rows' choice ([`Model::context_policy`]), and
    /// the context keeps that spec.
    pub fn compress(model: &Model, policy: &PolicySpec, tokens: &[u32]) -> Result<Context> {
        Ok(Self::compress_each(model, std::slice::from_ref(policy), tokens)?.pop().expect("one policy, one context"))
    }

    /// [`Context::compress`] under each of `policies`, sharing the prompt's
    /// prefill where their caches can ([`prefill_shared`]); each context is
    /// bit-identical to its own `compress`.
    pub fn compress_each(model: &Model, policies: &[PolicySpec], tokens: &[u32]) -> Result<Vec<Context>> {
        if tokens.is_empty() {
            return Err(EngineError::Request("the context is empty".into()));
        }
        check_fits(model, tokens.len(), "context")?;
        let policies: Vec<PolicySpec> = policies.iter().map(|p| model.context_policy(p, tokens.len())).collect();
        let mut sessions = policies
            .iter()
            .map(|p| Session::new(model, p, tokens.len(), tokens.len()))
            .collect::<kvslim_models::Result<Vec<_>>>()?;
        let mut each: Vec<&mut Session<'_>> = sessions.iter_mut().collect();
        prefill_shared(model, tokens, &mut each)?;
        let fingerprint = model.fingerprint();
        Ok(sessions
            .into_iter()
            .zip(policies)
            .map(|(s, policy)| Context {
                tokens: tokens.to_vec(),
                policy,
                cache: s.cache,
                fingerprint: fingerprint.clone(),
                meta: serde_json::Value::Null,
            })
            .collect())
    }

    /// The caller's metadata, saved with the context (`null` unless set).
    pub fn meta(&self) -> &serde_json::Value {
        &self.meta
    }

    /// Sets [`Context::meta`].
    pub fn with_meta(mut self, meta: serde_json::Value) -> Self {
        self.meta = meta;
        self
    }

    /// The context's tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The policy it was compressed under (and that keeps running in forks).
    pub fn policy(&self) -> &PolicySpec {
        &self.policy
    }

    /// The compressed cache (read-only).
    pub fn cache(&self) -> &SequenceCache {
        &self.cache
    }

    /// Allocated K/V and metadata bytes of the kept cache.
    pub fn kv_bytes(&self) -> KvBytes {
        self.cache.store().bytes()
    }

    /// K/V bytes the full cache would hold for the same tokens, in the
    /// same storage dtype: what compression is measured against.
    pub fn kv_bytes_full(&self) -> usize {
        let s = self.cache.store();
        let head = s.head(0, 0);
        s.layers() * s.kv_heads() * 2 * head.dtype().row_bytes(head.head_dim()) * self.tokens.len()
    }

    /// A session continuing the context, with room for `more` tokens after
    /// it: the cache is cloned (paged K/V shared until written) and grown
    /// where its capacity depends on the length (the full cache).
    pub fn fork<'m>(&self, model: &'m Model, more: usize) -> Result<Session<'m>> {
        self.check_model(model)?;
        let mut cache = self.cache.clone();
        cache.reserve(self.cache.next_pos() + more);
        Ok(Session::with_cache(model, cache))
    }

    /// Feeds `question` into a fork with room for `answer` more tokens, one
    /// decode step per token (the policy scores and evicts at each, as in
    /// any decode step); returns the fork and the logits of the question's
    /// last token. Under `full` (nothing scored, nothing evicted) the
    /// question goes in as one prefill chunk instead: the same attention up
    /// to rounding, with the weights read once instead of once per token
    /// (on a 17.5K-token context a 35-token question took 3.4–3.9 s as
    /// decode steps).
    pub fn ask<'m>(&self, model: &'m Model, question: &[u32], answer: usize) -> Result<(Session<'m>, Vec<f32>)> {
        let mut s = self.fork_for(model, question, answer)?;
        let (last, head) = question.split_last().expect("fork_for refuses an empty question");
        if self.question_as_chunk() {
            let logits = s.feed(question, Logits::Last)?.to_vec();
            return Ok((s, logits));
        }
        for &t in head {
            s.feed(&[t], Logits::None)?;
        }
        let logits = s.feed(&[*last], Logits::Last)?.to_vec();
        Ok((s, logits))
    }

    /// A fork with room for `question` and `answer` more tokens, once the
    /// question is known to fit.
    fn fork_for<'m>(&self, model: &'m Model, question: &[u32], answer: usize) -> Result<Session<'m>> {
        if question.is_empty() {
            return Err(EngineError::Request("the question is empty".into()));
        }
        let at = self.cache.next_pos() + question.len();
        if !self.cache.bounded() && at >= model.config.context_len {
            return Err(EngineError::Request(format!(
                "the context ({} tokens) and the question ({} tokens) exceed the model's context of {}",
                self.tokens.len(),
                question.len(),
                model.config.context_len
            )));
        }
        self.fork(model, question.len() + answer)
    }

    /// Under `full` (nothing scored or evicted) a question goes in as one
    /// prefill chunk; under any other policy as decode steps.
    fn question_as_chunk(&self) -> bool {
        matches!(self.policy.token, TokenPolicySpec::Full) && self.policy.head.is_none()
    }

    /// Answers `question` (its tokens, chat template applied by the caller)
    /// on a fork: [`Context::ask`] then generation as `opts` says
    /// (`opts.policy` is not read: the context's policy runs);
    /// `on_token` sees each new id and returns `false` to stop. The
    /// answer's `time_to_first_token_s` is the question's feed plus the
    /// first sample; `prompt_tokens` counts the context and the question.
    pub fn generate(
        &self,
        model: &Model,
        question: &[u32],
        opts: &GenerateOptions,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation> {
        let mut g = Self::answer(model, &[(self, question, opts)], |_, t| on_token(t))?;
        Ok(g.pop().expect("one answer per question"))
    }

    /// Answers every `(context, question, options)` of `asks` as
    /// [`Context::generate`] does, each on its own fork, all decoded in
    /// lockstep (one pass over the weights per step for all: a question's
    /// tokens are that fork's first steps). Each answer equals its own
    /// `generate`'s bit for bit; its `time_to_first_token_s` counts from the
    /// start of the call.
    pub fn answer_each(model: &Model, asks: &[(&Context, &[u32], &GenerateOptions)]) -> Result<Vec<Generation>> {
        Self::answer(model, asks, |_, _| true)
    }

    fn answer(
        model: &Model,
        asks: &[(&Context, &[u32], &GenerateOptions)],
        on_token: impl FnMut(usize, u32) -> bool,
    ) -> Result<Vec<Generation>> {
        let start = Instant::now();
        // per ask: its fork, the logits of its question when fed as a chunk, and its token limit
        let mut forks = Vec::with_capacity(asks.len());
        for &(ctx, question, opts) in asks {
            opts.sampling.validate().map_err(EngineError::Request)?;
            let (s, logits) = if ctx.question_as_chunk() {
                let (s, logits) = ctx.ask(model, question, opts.max_tokens)?;
                (s, Some(logits))
            } else {
                (ctx.fork_for(model, question, opts.max_tokens)?, None)
            };
            let at = ctx.cache.next_pos() + question.len();
            let max_new = new_token_limit_at(&s, at, opts.max_tokens);
            forks.push((s, logits, max_new, at));
        }
        let asked = start.elapsed().as_secs_f64();
        let prompt_tokens: Vec<usize> = forks.iter().map(|f| f.3).collect();
        let mut runs: Vec<Lockstep<'_, '_>> = forks
            .iter_mut()
            .zip(asks)
            .map(|((s, logits, max_new, _), &(_, question, o))| {
                let (eos, sampling) = (o.eos.clone(), o.sampling.clone());
                match logits {
                    Some(l) => Lockstep::after_logits(s, sampling, eos, l, (*max_new, asked)),
                    None => Lockstep::after_tokens(s, sampling, eos, question.to_vec(), *max_new),
                }
            })
            .collect();
        lockstep::run(&mut runs, on_token)?;
        Ok(runs.into_iter().zip(prompt_tokens).map(|(r, n)| r.into_generation(n)).collect())
    }

    fn check_model(&self, model: &Model) -> Result<()> {
        let fp = model.fingerprint();
        if fp != self.fingerprint {
            return Err(EngineError::Request(format!(
                "the context was made with model {}, not this one ({fp})",
                self.fingerprint
            )));
        }
        Ok(())
    }

    /// The context as the bytes of a file (see the module docs).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let header = Header {
            model: self.fingerprint.clone(),
            policy: self.policy.to_string(),
            tokens: self.tokens.clone(),
            base_len: self.tokens.len(),
            kvslim: env!("CARGO_PKG_VERSION").into(),
            meta: self.meta.clone(),
        };
        let header = serde_json::to_vec(&header).map_err(|e| EngineError::Request(format!("context header: {e}")))?;
        let mut cache = Vec::new();
        self.cache.save(&mut cache).map_err(kvslim_models::Error::from)?;
        let mut out = Vec::with_capacity(32 + header.len() + cache.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(header.len() as u64).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&(cache.len() as u64).to_le_bytes());
        out.extend_from_slice(&cache);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    /// Writes the context to `path` (through a temporary file beside it,
    /// renamed into place, so a crash never leaves half a file there).
    pub fn save(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes()?;
        let io = |e: std::io::Error| EngineError::Request(format!("writing {}: {e}", path.display()));
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &bytes).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(e)
        })
    }

    /// Reads a context saved by [`Context::save`] for `model`. A truncated
    /// or corrupted file, one of another format version or one made with
    /// another model is an error saying which; never a panic.
    pub fn load(model: &Model, path: &Path) -> Result<Context> {
        let bytes =
            std::fs::read(path).map_err(|e| EngineError::Request(format!("reading {}: {e}", path.display())))?;
        Self::from_bytes(model, &bytes)
            .map_err(|e| EngineError::Request(format!("{} is not a usable context: {e}", path.display())))
    }

    /// [`Context::load`] from bytes in memory.
    pub fn from_bytes(model: &Model, bytes: &[u8]) -> Result<Context> {
        Self::from_bytes_in(model, bytes, None)
    }

    /// [`Context::from_bytes`] with the storage `pool_for` chooses: it may
    /// give the policy a page size and returns the page pool to draw from
    /// (a server keeps every context paged in its pools, so that its forks
    /// share the pages). The answers are the same: paged and fixed stores
    /// compute alike.
    pub fn from_bytes_in(model: &Model, bytes: &[u8], pool_for: Option<&PoolFor<'_>>) -> Result<Context> {
        let bad = |why: String| EngineError::Request(why);
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(bad("it is not a kvslim context (no KVSLIMCX magic)".into()));
        }
        if bytes.len() < MAGIC.len() + 4 + 8 + 8 + 4 {
            return Err(bad(format!("it is truncated ({} bytes)", bytes.len())));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != FORMAT_VERSION {
            return Err(bad(format!("it has format version {version}; this build reads version {FORMAT_VERSION}")));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
        // lengths first: a truncated file names itself before its checksum fails
        let header_len = u64::from_le_bytes(body[12..20].try_into().expect("8 bytes"));
        let header_end = 20u64.saturating_add(header_len);
        if header_end.saturating_add(8) > body.len() as u64 {
            return Err(bad(format!("it is truncated (a header of {header_len} bytes in {} bytes)", bytes.len())));
        }
        let header_end = header_end as usize;
        let cache_len = u64::from_le_bytes(body[header_end..header_end + 8].try_into().expect("8 bytes"));
        let cache_start = header_end + 8;
        if cache_len != (body.len() - cache_start) as u64 {
            return Err(bad(format!(
                "it is truncated or has bytes appended (a cache of {cache_len} bytes, {} present)",
                body.len() - cache_start
            )));
        }
        let computed = crc32fast::hash(body);
        if computed != stored {
            return Err(bad(format!("its checksum does not match (stored {stored:08x}, computed {computed:08x})")));
        }
        let header: Header = serde_json::from_slice(&body[20..header_end])
            .map_err(|e| bad(format!("its header is not valid JSON: {e}")))?;
        let fp = model.fingerprint();
        if header.model != fp {
            return Err(bad(format!("it was made with model {}, not this one ({fp})", header.model)));
        }
        let mut policy = PolicySpec::parse_and_load(&header.policy)
            .map_err(|e| bad(format!("its policy `{}`: {e}", header.policy)))?;
        let pool = pool_for.and_then(|f| f(&mut policy));
        let n = header.tokens.len();
        if n == 0 || header.base_len == 0 || n >= model.config.context_len {
            return Err(bad(format!("it holds {n} tokens for a model context of {}", model.config.context_len)));
        }
        if let Some(&t) = header.tokens.iter().find(|&&t| t as usize >= model.config.vocab_size) {
            return Err(bad(format!("token id {t} is outside the model's vocabulary")));
        }
        let cache = SequenceCache::restore(
            &policy,
            model.cache_shape(),
            (n, header.base_len),
            pool.as_ref(),
            &body[cache_start..],
        )
        .map_err(|e| bad(e.to_string()))?;
        if cache.next_pos() != n {
            return Err(bad(format!("its cache has seen {} tokens, its header lists {n}", cache.next_pos())));
        }
        Ok(Context { tokens: header.tokens, policy, cache, fingerprint: fp, meta: header.meta })
    }
}
