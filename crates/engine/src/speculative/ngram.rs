//! Prompt-lookup drafting: copies from the context that survive edits.

use super::Drafter;
use crate::Result;

/// Prompt-lookup drafts for answers that copy their context with edits
/// (code changes, rewrites): a copy cursor into the context that survives
/// the edits, plus suffix matching to find where to copy from.
///
/// * **Where to copy from.** The longest suffix of the context (up to
///   [`max_match`](Self::max_match) tokens) that also occurs earlier, the
///   latest occurrence on ties; at least [`min_match`](Self::min_match)
///   tokens, so a lone common token does not start a copy.
/// * **A cursor that follows the copy.** After each committed token the
///   cursor moves on if the token is the source's next one. An inserted
///   token (a type hint, a new argument) leaves it where it is; a token
///   found up to [`lookahead`](Self::lookahead) source tokens ahead resyncs
///   it past the skipped ones (a deletion or a replacement). While aligned,
///   drafts continue from the cursor unless a longer suffix matches
///   elsewhere.
/// * **Learned replacements.** When a resync skipped source tokens after
///   inserting others (`tmp` → `running_total`), the pair is remembered and
///   later drafts apply it wherever the source shows those tokens again, so
///   a rename costs one miss, not one per occurrence.
///
/// The state follows one growing context: a context shorter than the last
/// one seen starts afresh.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    /// Shortest suffix match that starts a copy from elsewhere.
    pub min_match: usize,
    /// Longest suffix compared when ranking occurrences.
    pub max_match: usize,
    /// Source tokens a resync may skip.
    pub lookahead: usize,
    /// Context index of the next source token to copy.
    cursor: Option<usize>,
    /// The last committed token was the source's (or ended a replacement).
    aligned: bool,
    /// Tokens committed since the cursor last matched (an insertion so far).
    pending: Vec<u32>,
    /// Learned replacements: source tokens → the tokens written instead.
    replacements: Vec<(Vec<u32>, Vec<u32>)>,
    /// Context tokens already observed.
    seen: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter {
            min_match: 2,
            max_match: 16,
            lookahead: 8,
            cursor: None,
            aligned: false,
            pending: Vec::new(),
            replacements: Vec::new(),
            seen: 0,
        }
    }
}

/// Replacements remembered at most (the oldest is dropped first).
const MAX_REPLACEMENTS: usize = 64;
/// Tokens written away from the source after which the cursor is dropped
/// (an insertion that long is new text, and would make a poor replacement).
const MAX_INSERTION: usize = 32;

impl NgramDrafter {
    /// Moves the cursor over the tokens committed since the last call.
    fn observe(&mut self, context: &[u32]) {
        if context.len() < self.seen {
            *self = NgramDrafter {
                min_match: self.min_match,
                max_match: self.max_match,
                lookahead: self.lookahead,
                ..Default::default()
            };
        }
        for j in self.seen..context.len() {
            let Some(cur) = self.cursor else { break };
            let token = context[j];
            if self.pending.is_empty() && cur < j && context[cur] == token {
                self.cursor = Some(cur + 1);
                self.aligned = true;
                continue;
            }
            self.pending.push(token);
            self.aligned = false;
            if self.pending.len() > MAX_INSERTION {
                // new text, not an edit: copies start again from suffix matches
                self.cursor = None;
                self.pending.clear();
                continue;
            }
            // a known replacement written out in full
            let replaced = self
                .replacements
                .iter()
                .find(|(from, to)| {
                    *to == self.pending && cur + from.len() <= j && context[cur..cur + from.len()] == from[..]
                })
                .map(|(from, _)| from.len());
            if let Some(skip) = replaced {
                self.resync(cur + skip);
                continue;
            }
            // the source again, `skip` tokens on: what was written since the
            // cursor stopped replaced those tokens
            if let Some(skip) = (0..=self.lookahead).find(|&o| cur + o < j && context[cur + o] == token) {
                let inserted = &self.pending[..self.pending.len() - 1];
                if skip > 0 && !inserted.is_empty() {
                    let from = context[cur..cur + skip].to_vec();
                    let to = inserted.to_vec();
                    self.replacements.retain(|(f, _)| *f != from);
                    if self.replacements.len() == MAX_REPLACEMENTS {
                        self.replacements.remove(0);
                    }
                    self.replacements.push((from, to));
                }
                self.resync(cur + skip + 1);
            }
        }
        self.seen = context.len();
    }

    fn resync(&mut self, cursor: usize) {
        self.cursor = Some(cursor);
        self.pending.clear();
        self.aligned = true;
    }

    /// Length of the common suffix of `context[..=i]` and `context`.
    fn match_len(&self, context: &[u32], i: usize) -> usize {
        let last = context.len() - 1;
        (0..self.max_match.min(i + 1)).take_while(|&m| context[i - m] == context[last - m]).count()
    }

    /// Up to `k` tokens copied from `source` on, with learned replacements.
    fn copy_from(&self, context: &[u32], source: usize, k: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(k);
        let mut i = source;
        while out.len() < k && i < context.len() {
            let rest = &context[i..];
            let hit =
                self.replacements.iter().filter(|(from, _)| rest.starts_with(from)).max_by_key(|(from, _)| from.len());
            match hit {
                Some((from, to)) => {
                    out.extend_from_slice(to);
                    i += from.len();
                }
                None => {
                    out.push(context[i]);
                    i += 1;
                }
            }
        }
        out.truncate(k);
        out
    }
}

impl Drafter for NgramDrafter {
    fn draft(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>> {
        self.observe(context);
        let Some(&last) = context.last() else { return Ok(Vec::new()) };
        let len = context.len();
        // the earlier `last` with the longest common suffix (latest on ties)
        let (mut best, mut best_len) = (None, 0);
        for i in (0..len - 1).rev() {
            if context[i] == last {
                let m = self.match_len(context, i);
                if m > best_len {
                    (best, best_len) = (Some(i), m);
                }
            }
        }
        if let Some(cur) = self.cursor.filter(|&c| self.aligned && c < len) {
            let at_cursor = if cur >= 1 && cur < len { self.match_len(context, cur - 1) } else { 0 };
            if at_cursor >= best_len || best_len < self.min_match {
                return Ok(self.copy_from(context, cur, k));
            }
        }
        match best {
            Some(i) if best_len >= self.min_match => {
                self.resync(i + 1);
                Ok(self.copy_from(context, i + 1, k))
            }
            _ => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drafts `k` tokens after each prefix of `answer` appended to `source`,
    /// as a run would call the drafter (one growing context).
    fn drafts_along(source: &[u32], answer: &[u32], k: usize) -> Vec<Vec<u32>> {
        let mut d = NgramDrafter::default();
        let mut context = source.to_vec();
        let mut out = Vec::new();
        for &t in answer {
            context.push(t);
            out.push(d.draft(&context, k).unwrap());
        }
        out
    }

    #[test]
    fn copies_on_after_an_insertion() {
        // source: def f ( a , b ) : ; answer inserts `: int` after `a`
        let source = [1, 2, 3, 10, 4, 11, 5, 6, 99];
        let answer = [1, 2, 3, 10, 20, 21, 4];
        let drafts = drafts_along(&source, &answer, 3);
        assert_eq!(drafts[2], vec![10, 4, 11], "suffix `1 2 3` starts the copy");
        // after `20 21` (inserted) and `4` (the source's next token) the cursor is aligned again
        assert_eq!(drafts[6], vec![11, 5, 6]);
    }

    #[test]
    fn a_learned_replacement_is_applied_to_later_occurrences() {
        // source: x = tmp + tmp ; y = tmp  (tmp = 7); answer renames tmp → 30 31
        let source = [1, 2, 7, 3, 7, 4, 5, 2, 7, 9];
        let answer = [1, 2, 30, 31, 3];
        let drafts = drafts_along(&source, &answer, 6);
        // `30 31` replaced source `7`, so the rest of the copy renames too
        assert_eq!(drafts[4], vec![30, 31, 4, 5, 2, 30]);
    }

    #[test]
    fn a_lone_common_token_does_not_start_a_copy() {
        let source = [5, 6, 7, 8];
        assert!(drafts_along(&source, &[9, 6], 4)[1].is_empty());
        assert_eq!(drafts_along(&source, &[5, 6], 2)[1], vec![7, 8]);
    }

    #[test]
    fn the_longest_suffix_match_wins_over_the_latest() {
        // `2 3` occurs twice; only the first occurrence is preceded by `1`
        let source = [1, 2, 3, 40, 9, 2, 3, 50, 8];
        assert_eq!(drafts_along(&source, &[1, 2, 3], 1)[2], vec![40]);
        assert_eq!(drafts_along(&source, &[7, 2, 3], 1)[2], vec![50], "ties: the latest occurrence");
    }

    #[test]
    fn a_long_insertion_drops_the_cursor() {
        let source = [1, 2, 3, 4, 5, 6];
        let mut answer = vec![1, 2];
        answer.extend(100..100 + MAX_INSERTION as u32 + 1);
        answer.push(3);
        // `3` would resync the cursor after a short insertion; after a long one
        // only a suffix match can start a copy, and `… 3` has none of two tokens
        assert!(drafts_along(&source, &answer, 2).last().unwrap().is_empty());
        let short: Vec<u32> = vec![1, 2, 100, 101, 3];
        assert_eq!(drafts_along(&source, &short, 2).last().unwrap(), &vec![4, 5]);
    }

    #[test]
    fn a_shorter_context_starts_afresh() {
        let mut d = NgramDrafter::default();
        assert_eq!(d.draft(&[1, 2, 3, 4, 1, 2], 2).unwrap(), vec![3, 4]);
        assert_eq!(d.draft(&[5, 6, 5, 6], 2).unwrap(), vec![5, 6]);
    }
}
