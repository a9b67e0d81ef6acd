//! One sequence being run: the model, its KV cache and scratch buffers.

use kvslim_cache::{KvBytes, PolicySpec, SequenceCache};
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
    pub fn new(model: &'m Model, policy: &PolicySpec, max_len: usize, base_len: usize) -> Self {
        Session {
            model,
            cache: model.new_cache(policy, max_len, base_len),
            scratch: Scratch::new(),
            chunked_logits: Vec::new(),
        }
    }

    /// Runs a chunk of tokens (prefill when longer than one). A policy with
    /// streaming prefill gets the prompt in its own chunk size.
    pub fn feed(&mut self, tokens: &[u32], want: Logits) -> kvslim_models::Result<&[f32]> {
        let chunk = self.cache.policy.prefill_chunk().unwrap_or(usize::MAX).max(1);
        if tokens.len() <= chunk {
            self.model.forward(tokens, &mut self.cache, &mut self.scratch, want)?;
            return Ok(self.scratch.logits());
        }
        self.chunked_logits.clear();
        let pieces = tokens.len().div_ceil(chunk);
        for (i, part) in tokens.chunks(chunk).enumerate() {
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
        self.cache.next_pos
    }

    /// Allocated KV and metadata bytes.
    pub fn kv_bytes(&self) -> KvBytes {
        self.cache.store.bytes()
    }
}
