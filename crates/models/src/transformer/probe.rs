//! KVzip's repeat probe (`prefill=kvzip[:C]`, docs/policies.md): after a
//! prefill chunk, the chunk's tokens again, in pieces of C tokens, each
//! after a reconstruction instruction, as KVzip scores a context. A
//! piece's rows sit right after the prompt (every piece from the same
//! position, as each of KVzip's repeats follows the context) and attend
//! to the first [`PROBE_SINKS`] candidates, their own piece of the prompt
//! and themselves: the probe's attention grows linearly with the prompt.
//! The rows only score; the cache drops them.

use super::Model;
use kvslim_cache::SequenceCache;
use std::ops::Range;

/// The first candidates every piece's repeat also sees (attention sinks,
/// as KVzip's system prompt): they score from every piece.
pub const PROBE_SINKS: usize = 4;

/// Tokens of the previous piece that follow the instruction of every piece
/// after the first, as KVzip's "starting with …" cue.
const CUE_TOKENS: usize = 8;

/// The text of KVzip's reconstruction instruction (the first piece's).
pub const REPEAT_INSTRUCTION: &str = "\n\nRepeat the previous context exactly.\n";

/// The instruction of every later piece, followed by the cue.
pub const REPEAT_PART_INSTRUCTION: &str = "\n\nRepeat the part of the previous context exactly, starting with";

/// One piece of the probe: rows `row .. row + rows` of the chunk.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeSegment {
    /// Its first row in the chunk (after the prompt's rows and the
    /// earlier pieces').
    pub row: usize,
    /// Its first rows (instruction, cue): they attend and never score.
    pub lead: usize,
    /// All its rows: the lead, then the repeated tokens.
    pub rows: usize,
    /// The chunk rows it repeats, the candidates its repeat scores.
    pub piece: Range<usize>,
}

/// The position of chunk row `t` (`n` prompt rows at `p0`, then the
/// probe's pieces, each from `p0 + n`).
pub(super) fn row_position(p0: usize, n: usize, probe: &[ProbeSegment], t: usize) -> usize {
    match probe.iter().find(|s| (s.row..s.row + s.rows).contains(&t)) {
        Some(s) => p0 + n + (t - s.row),
        None => p0 + t,
    }
}

impl Model {
    /// A KVzip cache's chunk `tokens` followed by its repeat probe, with
    /// the pieces' layout; `None` when the cache does not score by one
    /// ([`SequenceCache::repeat_probe`]) or the chunk is a single token. A
    /// leading BOS is not repeated (it is a sink); where learned positions
    /// end, the pieces shrink to fit after the prompt.
    pub(super) fn repeat_probe(&self, tokens: &[u32], cache: &SequenceCache) -> Option<(Vec<u32>, Vec<ProbeSegment>)> {
        let c = &self.config;
        let chunk = cache.repeat_probe()?;
        let n = tokens.len();
        if n < 2 {
            return None;
        }
        let skip = usize::from(c.bos_token_id == Some(tokens[0]));
        let longest_lead = self.repeat_prompt.len().max(self.repeat_part_prompt.len() + CUE_TOKENS);
        let step = match c.learned_positions {
            Some(_) => chunk.min(c.context_len.saturating_sub(cache.next_pos() + n + longest_lead)),
            None => chunk,
        };
        if step == 0 || skip == n {
            return None;
        }
        let mut all = tokens.to_vec();
        let mut segments = Vec::new();
        for start in (skip..n).step_by(step) {
            let row = all.len();
            if start == skip {
                all.extend_from_slice(&self.repeat_prompt);
            } else {
                all.extend_from_slice(&self.repeat_part_prompt);
                all.extend_from_slice(&tokens[start.saturating_sub(CUE_TOKENS).max(skip)..start]);
            }
            let piece = start..(start + step).min(n);
            let lead = all.len() - row;
            all.extend_from_slice(&tokens[piece.clone()]);
            segments.push(ProbeSegment { row, lead, rows: lead + piece.len(), piece });
        }
        Some((all, segments))
    }
}
