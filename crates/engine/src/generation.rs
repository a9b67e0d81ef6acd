//! What one generation yields (its ids, why it stopped, its timings) and
//! how a sampled token is taken into it: shared by plain, lockstep and
//! speculative decoding.

use kvslim_cache::KvBytes;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Eos,
    MaxTokens,
    /// The callback asked to stop (client gone, stop string seen).
    Cancelled,
}

/// The result of one generation (serializable: an interrupted evaluation
/// keeps the generations it finished).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Generation {
    /// Generated ids only (prompt excluded, EOS excluded).
    pub token_ids: Vec<u32>,
    pub prompt_tokens: usize,
    pub stop: StopReason,
    /// Prompt prefill time including the first sampled token.
    pub time_to_first_token_s: f64,
    /// Time of all decode steps after the first token.
    pub decode_s: f64,
    pub kv_bytes: KvBytes,
}

/// Takes `t` into the output (`out`, and the caller's `on_token`) unless it
/// ends the run: `Some(Eos)` for an end-of-sequence token (not taken),
/// `Some(Cancelled)` when `on_token` says stop (taken).
pub(crate) fn take_token(
    t: u32,
    eos: &[u32],
    out: &mut Vec<u32>,
    on_token: &mut impl FnMut(u32) -> bool,
) -> Option<StopReason> {
    if eos.contains(&t) {
        return Some(StopReason::Eos);
    }
    out.push(t);
    if !on_token(t) {
        return Some(StopReason::Cancelled);
    }
    None
}
