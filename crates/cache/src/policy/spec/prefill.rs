//! How H2O's family prefills a prompt longer than its budget
//! (`prefill=` of the grammar; read by `family.rs`).

/// The piece of the prompt each KVzip repeat covers (`prefill=kvzip`),
/// as KVzip's own scoring (2,000 tokens).
pub const KVZIP_CHUNK: usize = 2000;

/// How H2O treats a prompt longer than its budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillMode {
    /// Full causal attention over the prompt, then keep recent + top heavy.
    Full,
    /// Chunks of C tokens, eviction after each chunk.
    Stream(usize),
    /// SnapKV: one chunk; only the last `window` prompt queries score the
    /// prompt's tokens (an observation window), the scores max-pooled over
    /// `pool` neighbouring positions, then keep recent + top heavy.
    Snap { window: usize, pool: usize },
    /// Expected attention: one chunk; every prompt token scored by the
    /// attention the prompt's query distribution would pay it over the
    /// next `future` positions (query-agnostic), then keep recent + top heavy.
    Expect { future: usize },
    /// KVzip-style: one chunk, then the chunk repeated after it
    /// (teacher-forced) in pieces of `chunk` tokens; every prompt token
    /// scored by the most attention a repeat query of its piece paid it,
    /// then keep recent + top heavy.
    Kvzip { chunk: usize },
    /// KVzap-style: one chunk, no probe; every prompt token scored by a
    /// learned per-(layer, KV head) linear predictor of its log KVzip score
    /// from the layer's normalised input hidden state (`file`: the
    /// predictor, or `None` for the one kept for the model's fingerprint),
    /// then keep recent + top heavy.
    Kvzap { file: Option<&'static str> },
    /// ADAPTIVE_RKV-style: one chunk scored as `Full`; the top tokens
    /// holding `mass_permille`/1000 of the attention mass rank first, the
    /// rest of the budget goes to the most diverse keys.
    Rkv { mass_permille: u16 },
}
