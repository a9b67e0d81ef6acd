//! One sequence being run: the model, its KV cache and scratch buffers.

use kvslim_cache::{KvBytes, PolicySpec, SequenceCache};
use kvslim_models::{Logits, Model, Scratch};

/// A sequence in flight. Create one per request; it owns all per-sequence
/// state (cache slots, policy state, scratch), so sequences never share it.
pub struct Session<'m> {
    pub model: &'m Model,
    pub cache: SequenceCache,
    pub scratch: Scratch,
}

impl<'m> Session<'m> {
    /// A session able to hold `max_len` tokens under `policy`.
    pub fn new(model: &'m Model, policy: &PolicySpec, max_len: usize) -> Self {
        Session { model, cache: model.new_cache(policy, max_len), scratch: Scratch::new() }
    }

    /// Runs a chunk of tokens (prefill when longer than one).
    pub fn feed(&mut self, tokens: &[u32], want: Logits) -> kvslim_models::Result<&[f32]> {
        self.model.forward(tokens, &mut self.cache, &mut self.scratch, want)?;
        Ok(self.scratch.logits())
    }

    /// Position of the next token.
    pub fn position(&self) -> usize {
        self.cache.next_pos
    }

    /// Allocated KV and metadata bytes.
    pub fn kv_bytes(&self) -> KvBytes {
        self.cache.store.bytes()
    }
}
