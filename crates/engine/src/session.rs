//! One sequence being run: the model, its KV cache and scratch buffers.

use kvslim_cache::{KvBytes, PagePool, PolicySpec, SequenceCache};
use kvslim_models::{Logits, Model, Scratch};

/// A sequence in flight. Create one per request; it owns all per-sequence
/// state (cache slots, policy state, scratch), so sequences never share it.
pub struct Session<'m> {
    pub model: &'m Model,
    pub cache: SequenceCache,
    pub scratch: Scratch,
    /// Logits of every token when a streamed prefill spans several chunks.
    chunked_logits: Vec<f32>,
}

impl<'m> Session<'m> {
    /// A session able to hold `max_len` tokens under `policy`; percentage
    /// budgets resolve against `base_len` (the prompt for generation, the
    /// whole sequence for perplexity).
    /// Fails when the policy does not fit the model (a CHAI plan for
    /// another model).
    pub fn new(model: &'m Model, policy: &PolicySpec, max_len: usize, base_len: usize) -> kvslim_models::Result<Self> {
        Self::in_pool(model, policy, max_len, base_len, None)
    }

    /// As [`Session::new`], drawing KV pages from a shared pool (see
    /// [`kvslim_cache::PagePool`]).
    pub fn in_pool(
        model: &'m Model,
        policy: &PolicySpec,
        max_len: usize,
        base_len: usize,
        pool: Option<&PagePool>,
    ) -> kvslim_models::Result<Self> {
        Ok(Self::with_cache(model, model.new_cache_in(policy, max_len, base_len, pool)?))
    }

    /// A session continuing an existing cache (a fork: a beam, or a request
    /// reusing a cached prompt; paged K/V stay shared until written).
    pub fn with_cache(model: &'m Model, cache: SequenceCache) -> Self {
        Session { model, cache, scratch: Scratch::new(), chunked_logits: Vec::new() }
    }

    /// Runs a chunk of tokens (prefill when longer than one). A policy with
    /// streaming prefill gets the prompt in its own chunk size, and online
    /// CHAI gets its probe as a chunk of its own so clustering happens right
    /// after the probe's last token.
    pub fn feed(&mut self, tokens: &[u32], want: Logits) -> kvslim_models::Result<&[f32]> {
        let chunk = self.cache.prefill_chunk().unwrap_or(usize::MAX).max(1);
        let probe_cut = match self.cache.probe_remaining() {
            0 => usize::MAX,
            left => left,
        };
        if tokens.len() <= chunk && tokens.len() <= probe_cut {
            self.model.forward(tokens, &mut self.cache, &mut self.scratch, want)?;
            return Ok(self.scratch.logits());
        }
        let mut parts: Vec<&[u32]> = Vec::new();
        let (head, rest) = tokens.split_at(probe_cut.min(tokens.len()));
        parts.extend(head.chunks(chunk));
        parts.extend(rest.chunks(chunk));
        self.chunked_logits.clear();
        let pieces = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            let last = i + 1 == pieces;
            let w = match want {
                Logits::All => Logits::All,
                Logits::Last if last => Logits::Last,
                _ => Logits::None,
            };
            self.model.forward(part, &mut self.cache, &mut self.scratch, w)?;
            if want == Logits::All {
                self.chunked_logits.extend_from_slice(self.scratch.logits());
            }
        }
        Ok(if want == Logits::All { &self.chunked_logits } else { self.scratch.logits() })
    }

    /// Position of the next token.
    pub fn position(&self) -> usize {
        self.cache.next_pos()
    }

    /// Allocated KV and metadata bytes.
    pub fn kv_bytes(&self) -> KvBytes {
        self.cache.store().bytes()
    }
}
