//! Optional record of a forward call's intermediate values, for parity
//! tests and diagnostics. Recording allocates; it is never on in the
//! decode hot loop.

use crate::config::ModelConfig;

/// Intermediate values of one forward call (set `Scratch::trace` to
/// `Some(Trace::default())` before the call).
#[derive(Default, Debug)]
pub struct Trace {
    /// Per layer, the input hidden states `[n, hidden]`.
    pub hidden: Vec<Vec<f32>>,
    /// Per layer, attention probabilities `[heads, n, ctx]` indexed by
    /// original position (ctx = last position + 1).
    pub attn: Vec<Vec<f32>>,
    /// Width of the `attn` rows.
    pub ctx: usize,
    /// Per layer, the queries `[n, q_dim]`, keys and values `[n, kv_dim]`
    /// after RoPE: the streams a policy reference is driven with.
    pub qkv: Vec<[Vec<f32>; 3]>,
    /// Decode steps only: per layer, per KV head, the original positions of
    /// the candidate set D_t the new token attended over.
    pub candidates: Vec<Vec<Vec<u32>>>,
    /// Per layer, every query head's attention output `[n, q_dim]` (before W_O).
    pub att_out: Vec<Vec<f32>>,
}

impl Trace {
    /// Starts a new forward call whose last position is `ctx − 1`.
    pub(super) fn begin(&mut self, ctx: usize) {
        *self = Trace { ctx, ..Trace::default() };
    }

    /// Scatters one head's probabilities (token `tok` of `rows`) into the
    /// current layer's record, by original position.
    pub(super) fn record_head_attn(
        &mut self,
        c: &ModelConfig,
        head: usize,
        tok: usize,
        rows: usize,
        positions: &[u32],
        probs: &[f32],
    ) {
        let ctx = self.ctx;
        if self.attn.len() < self.hidden.len() {
            self.attn.push(vec![0f32; c.n_heads * rows * ctx]);
        }
        let layer = self.attn.last_mut().expect("pushed above");
        let row = &mut layer[(head * rows + tok) * ctx..(head * rows + tok + 1) * ctx];
        for (&p, &w) in positions.iter().zip(probs) {
            row[p as usize] = w;
        }
    }
}
