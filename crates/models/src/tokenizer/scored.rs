//! SentencePiece-style tokenization by score-ranked merges, as llama2.c's
//! `run.c` and llama.cpp's SPM tokenizer do: start from single characters
//! (unknown ones fall back to `<0xXX>` byte tokens), then repeatedly merge the
//! adjacent pair whose concatenation is in the vocabulary with the highest
//! score (leftmost on ties) until no pair merges.

use super::{Tokenizer, TokenizerKind};
use crate::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// How spaces are spelled in the vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceStyle {
    /// Literal ' ' (llama2.c vocabularies).
    Plain,
    /// U+2581 '▁' (SentencePiece / GGUF `llama`).
    Metaspace,
}

/// A scored vocabulary.
pub struct ScoredVocab {
    pieces: Vec<String>,
    scores: Vec<f32>,
    lookup: HashMap<String, u32>,
    /// id of `<0x00>`..`<0xFF>` when the vocabulary has byte tokens
    byte_ids: Option<[u32; 256]>,
    space: SpaceStyle,
    /// Prepend a space before encoding (SentencePiece's dummy prefix).
    dummy_prefix: bool,
    /// Ids that decode to nothing (BOS, EOS, unknown, control tokens).
    special: Vec<bool>,
}

impl ScoredVocab {
    /// Builds a vocabulary; `special[i]` marks ids never printed.
    pub fn new(
        pieces: Vec<String>,
        scores: Vec<f32>,
        special: Vec<bool>,
        space: SpaceStyle,
        dummy_prefix: bool,
    ) -> Self {
        let mut lookup = HashMap::with_capacity(pieces.len());
        for (i, p) in pieces.iter().enumerate() {
            lookup.entry(p.clone()).or_insert(i as u32);
        }
        let mut byte_ids = [0u32; 256];
        let mut all = true;
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            match lookup.get(&format!("<0x{b:02X}>")) {
                Some(&id) => *slot = id,
                None => all = false,
            }
        }
        ScoredVocab { pieces, scores, lookup, byte_ids: all.then_some(byte_ids), space, dummy_prefix, special }
    }

    pub fn len(&self) -> usize {
        self.pieces.len()
    }
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }
    /// The vocabulary string of `id` (chat templates print BOS/EOS by name).
    pub fn piece(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str)
    }

    /// Encodes text without BOS/EOS.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut s = String::with_capacity(text.len() + 3);
        if self.dummy_prefix {
            s.push(' ');
        }
        s.push_str(text);
        if self.space == SpaceStyle::Metaspace {
            s = s.replace(' ', "\u{2581}");
        }
        let mut toks: Vec<u32> = Vec::with_capacity(s.len());
        let mut buf = [0u8; 4];
        for ch in s.chars() {
            let piece = ch.encode_utf8(&mut buf);
            if let Some(&id) = self.lookup.get(&*piece) {
                toks.push(id);
            } else if let Some(bytes) = &self.byte_ids {
                toks.extend(piece.bytes().map(|b| bytes[b as usize]));
            } else {
                toks.push(0); // <unk>
            }
        }
        self.merge(toks)
    }

    /// Applies merges best-score-first (leftmost on ties) with a heap over
    /// adjacent pairs and a linked list of symbols: O(n log n), same result
    /// as rescanning all pairs after every merge.
    fn merge(&self, toks: Vec<u32>) -> Vec<u32> {
        use std::cmp::Ordering;
        use std::collections::BinaryHeap;
        #[derive(PartialEq)]
        struct Cand {
            score: f32,
            left: usize,
            left_id: u32,
            right_id: u32,
            merged: u32,
        }
        impl Eq for Cand {}
        impl Ord for Cand {
            fn cmp(&self, o: &Self) -> Ordering {
                self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
            }
        }
        impl PartialOrd for Cand {
            fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
                Some(self.cmp(o))
            }
        }
        let n = toks.len();
        let mut ids = toks;
        let mut alive = vec![true; n];
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut heap = BinaryHeap::new();
        let mut buf = String::new();
        let mut push = |heap: &mut BinaryHeap<Cand>, l: usize, r: usize, ids: &[u32]| {
            buf.clear();
            buf.push_str(&self.pieces[ids[l] as usize]);
            buf.push_str(&self.pieces[ids[r] as usize]);
            if let Some(&m) = self.lookup.get(&buf) {
                heap.push(Cand {
                    score: self.scores[m as usize],
                    left: l,
                    left_id: ids[l],
                    right_id: ids[r],
                    merged: m,
                });
            }
        };
        for i in 0..n.saturating_sub(1) {
            push(&mut heap, i, i + 1, &ids);
        }
        while let Some(c) = heap.pop() {
            let l = c.left;
            let r = next[l];
            if !alive[l] || r >= n || ids[l] != c.left_id || ids[r] != c.right_id {
                continue; // stale: one side was merged since this pair was queued
            }
            ids[l] = c.merged;
            alive[r] = false;
            next[l] = next[r];
            if next[r] < n {
                prev[next[r]] = l;
            }
            if prev[l] < n {
                push(&mut heap, prev[l], l, &ids);
            }
            if next[l] < n {
                push(&mut heap, l, next[l], &ids);
            }
        }
        (0..n).filter(|&i| alive[i]).map(|i| ids[i]).collect()
    }

    /// Decodes ids; byte tokens are reassembled into UTF-8, the dummy-prefix
    /// space at the start is dropped.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            let Some(p) = self.pieces.get(id as usize) else {
                continue;
            };
            if self.special.get(id as usize).copied().unwrap_or(false) {
                continue;
            }
            if p.len() == 6 && p.starts_with("<0x") && p.ends_with('>') {
                if let Ok(b) = u8::from_str_radix(&p[3..5], 16) {
                    bytes.push(b);
                    continue;
                }
            }
            bytes.extend_from_slice(p.as_bytes());
        }
        let mut s = String::from_utf8_lossy(&bytes).into_owned();
        if self.space == SpaceStyle::Metaspace {
            s = s.replace('\u{2581}', " ");
        }
        if self.dummy_prefix && s.starts_with(' ') {
            s.remove(0);
        }
        s
    }
}

/// Reads a llama2.c `tokenizer.bin`: i32 max_token_length, then per token
/// f32 score, i32 byte length, bytes. Ids 0/1/2 are `<unk>`/BOS/EOS.
pub fn load_llama2c(path: &Path) -> Result<Tokenizer> {
    let data = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let bad = |why: &str| Error::format(path, format!("not a llama2.c tokenizer: {why}"));
    if data.len() < 4 {
        return Err(bad("file shorter than its 4-byte header"));
    }
    let mut at = 4usize;
    let (mut pieces, mut scores) = (Vec::new(), Vec::new());
    while at < data.len() {
        if at + 8 > data.len() {
            return Err(bad(&format!("truncated entry header at byte {at}")));
        }
        let score = f32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"));
        let len = i32::from_le_bytes(data[at + 4..at + 8].try_into().expect("4 bytes"));
        at += 8;
        if len < 0 || at + len as usize > data.len() {
            return Err(bad(&format!("token {} claims {len} bytes past the end of the file", pieces.len())));
        }
        pieces.push(String::from_utf8_lossy(&data[at..at + len as usize]).into_owned());
        scores.push(score);
        at += len as usize;
    }
    if pieces.len() < 3 {
        return Err(bad("fewer than 3 tokens"));
    }
    let special = (0..pieces.len()).map(|i| i < 3).collect();
    let vocab = ScoredVocab::new(pieces, scores, special, SpaceStyle::Plain, true);
    Ok(Tokenizer {
        kind: TokenizerKind::Scored(Box::new(vocab)),
        add_bos: true,
        bos: Some(1),
        eos: vec![2],
        chat_template: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_by_best_score_with_byte_fallback() {
        let mut pieces: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        pieces.extend((0..256).map(|b| format!("<0x{b:02X}>")));
        let base = pieces.len() as u32;
        pieces.extend(["\u{2581}", "a", "b", "ab", "\u{2581}ab"].map(String::from));
        let mut scores = vec![0.0; pieces.len()];
        scores[base as usize + 3] = -1.0; // "ab"
        scores[base as usize + 4] = -2.0; // "▁ab"
        let special = (0..pieces.len()).map(|i| i < 3).collect();
        let v = ScoredVocab::new(pieces, scores, special, SpaceStyle::Metaspace, true);
        assert_eq!(v.encode("ab"), vec![base + 4]);
        // 'é' is not in the vocabulary: two byte tokens
        let ids = v.encode("é");
        assert_eq!(ids, vec![base, 3 + 0xC3, 3 + 0xA9]);
        assert_eq!(v.decode(&ids), "é");
        assert_eq!(v.decode(&v.encode("ab ab")), "ab ab");
    }

    /// The heap-based merge equals the obvious rescan-everything loop.
    #[test]
    fn heap_merge_equals_naive_rescan() {
        let mut pieces: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let alphabet = ["a", "b", "c", "ab", "bc", "ca", "abc", "bca", "aa", "cc", "aab", "\u{2581}a"];
        pieces.extend(alphabet.iter().map(|s| s.to_string()));
        pieces.push("\u{2581}".into());
        let scores: Vec<f32> = (0..pieces.len()).map(|i| ((i * 7) % 5) as f32).collect();
        let special = (0..pieces.len()).map(|i| i < 3).collect();
        let v = ScoredVocab::new(pieces.clone(), scores.clone(), special, SpaceStyle::Metaspace, false);
        let naive = |mut toks: Vec<u32>| loop {
            let mut best: Option<(f32, usize, u32)> = None;
            for i in 0..toks.len().saturating_sub(1) {
                let m = format!("{}{}", pieces[toks[i] as usize], pieces[toks[i + 1] as usize]);
                if let Some(id) = pieces.iter().position(|p| *p == m) {
                    if best.is_none_or(|(b, _, _)| scores[id] > b) {
                        best = Some((scores[id], i, id as u32));
                    }
                }
            }
            let Some((_, i, id)) = best else { return toks };
            toks[i] = id;
            toks.remove(i + 1);
        };
        let mut seed = 12345u64;
        for _ in 0..300 {
            let len = (seed % 13) as usize + 1;
            let text: String = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ["a", "b", "c", " "][(seed >> 60) as usize % 4]
                })
                .collect();
            let chars: Vec<u32> = text
                .replace(' ', "\u{2581}")
                .chars()
                .map(|ch| pieces.iter().position(|p| *p == ch.to_string()).unwrap() as u32)
                .collect();
            assert_eq!(v.encode(&text), naive(chars), "text {text:?}");
        }
    }
}
