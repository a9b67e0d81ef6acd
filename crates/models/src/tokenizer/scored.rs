//! SentencePiece-style tokenization by score-ranked merges, as llama2.c's
//! `run.c` and llama.cpp's SPM tokenizer do: start from single characters,
//! then repeatedly merge the adjacent pair whose concatenation is in the
//! vocabulary with the highest score (leftmost on ties) until no pair
//! merges; characters left outside the vocabulary fall back to `<0xXX>`
//! byte tokens.
//!
//! Before merging, tokens marked *verbatim* (GGUF user-defined tokens such
//! as Gemma's `"\n"` and runs of spaces, and, when asked, control tokens
//! such as `<start_of_turn>`) are cut out of the raw text, longest token
//! first, as llama.cpp's special-token partition does; merging then runs on
//! each remaining fragment separately.

use super::{Tokenizer, TokenizerKind};
use crate::{Error, Result};
use aho_corasick::AhoCorasick;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::Path;

/// How spaces are spelled in the vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceStyle {
    /// Literal ' ' (llama2.c vocabularies).
    Plain,
    /// U+2581 '▁' (SentencePiece / GGUF `llama`).
    Metaspace,
}

/// A multiplicative hash for the piece table: every merge step looks a
/// short string up, and SipHash (std's default, built against adversarial
/// inserts) costs several times more per lookup. The table's keys are the
/// model's own pieces, never user input, so flooding is not a concern.
#[derive(Default)]
struct PieceHasher(u64);

impl Hasher for PieceHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
        }
        let mut tail = 0u64;
        for (i, &b) in chunks.remainder().iter().enumerate() {
            tail |= (b as u64) << (8 * i);
        }
        self.0 = (self.0.rotate_left(5) ^ tail ^ ((bytes.len() as u64) << 56)).wrapping_mul(K);
    }
    fn write_u8(&mut self, b: u8) {
        self.write(&[b]);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type PieceMap = HashMap<Box<str>, u32, BuildHasherDefault<PieceHasher>>;

/// Tokens cut out of the raw text before merging.
struct Verbatim {
    /// Finds every occurrence, overlapping ones included, of every pattern.
    matcher: AhoCorasick,
    /// Per pattern: its token id, whether it is a control token (matched
    /// only on request), and its priority (0 first: longest text, then
    /// lowest id).
    id: Vec<u32>,
    control: Vec<bool>,
    rank: Vec<u32>,
}

/// A piece of the input after the verbatim partition.
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// A scored vocabulary.
pub struct ScoredVocab {
    pieces: Vec<String>,
    scores: Vec<f32>,
    lookup: PieceMap,
    /// Longest piece in bytes: longer pairs are not looked up at all.
    max_piece: usize,
    /// id of `<0x00>`..`<0xFF>` when the vocabulary has byte tokens
    byte_ids: Option<[u32; 256]>,
    space: SpaceStyle,
    /// Prepend a space to text that starts the input or follows a verbatim
    /// token (SentencePiece's dummy prefix, as llama.cpp applies it).
    dummy_prefix: bool,
    /// Ids that decode to nothing (BOS, EOS, unknown, control tokens).
    special: Vec<bool>,
    verbatim: Option<Verbatim>,
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
        let mut lookup = PieceMap::with_capacity_and_hasher(pieces.len(), Default::default());
        for (i, p) in pieces.iter().enumerate() {
            lookup.entry(p.as_str().into()).or_insert(i as u32);
        }
        let max_piece = pieces.iter().map(String::len).max().unwrap_or(0);
        let mut byte_ids = [0u32; 256];
        let mut all = true;
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            match lookup.get(format!("<0x{b:02X}>").as_str()) {
                Some(&id) => *slot = id,
                None => all = false,
            }
        }
        ScoredVocab {
            pieces,
            scores,
            lookup,
            max_piece,
            byte_ids: all.then_some(byte_ids),
            space,
            dummy_prefix,
            special,
            verbatim: None,
        }
    }

    /// Declares the tokens matched literally in the raw text before merging:
    /// `always` (GGUF user-defined tokens, e.g. Gemma's newline and space
    /// runs, which merges could never produce since they are not
    /// space-escaped) and `control` (matched only when [`Self::encode`] is
    /// asked to parse special tokens). Empty pieces and ids outside the
    /// vocabulary are ignored.
    pub fn with_verbatim(mut self, always: &[u32], control: &[u32]) -> Result<Self> {
        let mut entries: Vec<(u32, bool)> = always
            .iter()
            .map(|&i| (i, false))
            .chain(control.iter().map(|&i| (i, true)))
            .filter(|&(i, _)| self.pieces.get(i as usize).is_some_and(|p| !p.is_empty()))
            .collect();
        entries.sort_unstable_by_key(|&(i, _)| i);
        entries.dedup_by_key(|e| e.0);
        if entries.is_empty() {
            self.verbatim = None;
            return Ok(self);
        }
        let mut order: Vec<usize> = (0..entries.len()).collect();
        order.sort_by_key(|&k| (std::cmp::Reverse(self.pieces[entries[k].0 as usize].len()), entries[k].0));
        let mut rank = vec![0u32; entries.len()];
        for (r, &k) in order.iter().enumerate() {
            rank[k] = r as u32;
        }
        let matcher = AhoCorasick::new(entries.iter().map(|&(i, _)| self.pieces[i as usize].as_bytes()))
            .map_err(|e| Error::Tokenizer(format!("cannot index the verbatim tokens: {e}")))?;
        self.verbatim = Some(Verbatim {
            matcher,
            id: entries.iter().map(|e| e.0).collect(),
            control: entries.iter().map(|e| e.1).collect(),
            rank,
        });
        Ok(self)
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

    /// The bytes `id` stands for, without the dummy-prefix removal that
    /// [`Self::decode`] applies at the start of a text (`<0xXX>` pieces are
    /// their byte, the metaspace is a space), and whether it is a special
    /// id (then the bytes are its piece, which decoding never prints).
    pub fn piece_bytes(&self, id: u32) -> Option<(Vec<u8>, bool)> {
        let p = self.pieces.get(id as usize)?;
        if self.special.get(id as usize).copied().unwrap_or(false) {
            return Some((p.as_bytes().to_vec(), true));
        }
        if p.len() == 6 && p.starts_with("<0x") && p.ends_with('>') {
            if let Ok(b) = u8::from_str_radix(&p[3..5], 16) {
                return Some((vec![b], false));
            }
        }
        let s = if self.space == SpaceStyle::Metaspace { p.replace('\u{2581}', " ") } else { p.clone() };
        Some((s.into_bytes(), false))
    }

    /// Encodes text without BOS/EOS. With `parse_special`, control tokens
    /// written in the text (`<start_of_turn>`) become their ids, as chat
    /// templates need; without, only user-defined tokens are (llama.cpp's
    /// `parse_special = false`).
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut prev_special = true;
        for frag in self.partition(text, parse_special) {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    let mut s = String::with_capacity(t.len() + 3);
                    if self.dummy_prefix && prev_special {
                        s.push(' ');
                    }
                    s.push_str(t);
                    if self.space == SpaceStyle::Metaspace {
                        s = s.replace(' ', "\u{2581}");
                    }
                    self.merge(&s, &mut out);
                    prev_special = false;
                }
            }
        }
        out
    }

    /// Splits the text at verbatim tokens: longer tokens claim their
    /// occurrences first, each left to right; an occurrence overlapping
    /// one already claimed is skipped. (Equivalent to llama.cpp's
    /// partition, which scans the fragments once per token, longest first,
    /// but one pass over the text whatever the number of tokens.)
    fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        if text.is_empty() {
            return Vec::new();
        }
        let Some(v) = &self.verbatim else {
            return vec![Fragment::Text(text)];
        };
        let mut found: Vec<(u32, usize, usize, u32)> = v
            .matcher
            .find_overlapping_iter(text)
            .filter(|m| parse_special || !v.control[m.pattern().as_usize()])
            .map(|m| {
                let k = m.pattern().as_usize();
                (v.rank[k], m.start(), m.end(), v.id[k])
            })
            .collect();
        if found.is_empty() {
            return vec![Fragment::Text(text)];
        }
        found.sort_unstable();
        let mut taken = vec![false; text.len()];
        let mut claimed: Vec<(usize, usize, u32)> = Vec::new();
        for (_, start, end, id) in found {
            if taken[start..end].iter().all(|&t| !t) {
                taken[start..end].iter_mut().for_each(|t| *t = true);
                claimed.push((start, end, id));
            }
        }
        claimed.sort_unstable();
        let mut frags = Vec::with_capacity(2 * claimed.len() + 1);
        let mut at = 0;
        for (start, end, id) in claimed {
            if start > at {
                frags.push(Fragment::Text(&text[at..start]));
            }
            frags.push(Fragment::Token(id));
            at = end;
        }
        if at < text.len() {
            frags.push(Fragment::Text(&text[at..]));
        }
        frags
    }

    /// Merges the characters of `s` best-score-first (leftmost on ties)
    /// with a heap over adjacent pairs and a linked list of symbols (byte
    /// spans of `s`): O(n log n), the same result as rescanning all pairs
    /// after every merge. Symbols left outside the vocabulary (single
    /// unknown characters) become byte tokens.
    fn merge(&self, s: &str, out: &mut Vec<u32>) {
        #[derive(PartialEq)]
        struct Cand {
            score: f32,
            left: usize,
            right: usize,
            /// byte length of the pair when queued: a stale entry differs
            size: usize,
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
        const NONE: usize = usize::MAX;
        let mut start: Vec<usize> = s.char_indices().map(|(i, _)| i).collect();
        let n = start.len();
        if n == 0 {
            return;
        }
        let mut end: Vec<usize> = start[1..].iter().copied().chain(std::iter::once(s.len())).collect();
        let mut next: Vec<usize> = (1..=n).map(|i| if i < n { i } else { NONE }).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| if i > 0 { i - 1 } else { NONE }).collect();
        let mut heap = BinaryHeap::with_capacity(n);
        let try_pair = |heap: &mut BinaryHeap<Cand>, l: usize, r: usize, start: &[usize], end: &[usize]| {
            let (a, b) = (start[l], end[r]);
            if b - a > self.max_piece {
                return;
            }
            if let Some(&m) = self.lookup.get(&s[a..b]) {
                heap.push(Cand { score: self.scores[m as usize], left: l, right: r, size: b - a });
            }
        };
        for i in 1..n {
            try_pair(&mut heap, i - 1, i, &start, &end);
        }
        while let Some(c) = heap.pop() {
            let (l, r) = (c.left, c.right);
            // a merged-away symbol has an empty span; a grown one a longer pair
            if start[l] == end[l] || start[r] == end[r] || (end[l] - start[l]) + (end[r] - start[r]) != c.size {
                continue;
            }
            end[l] = end[r];
            start[r] = end[r];
            next[l] = next[r];
            if next[r] != NONE {
                prev[next[r]] = l;
            }
            if prev[l] != NONE {
                try_pair(&mut heap, prev[l], l, &start, &end);
            }
            if next[l] != NONE {
                try_pair(&mut heap, l, next[l], &start, &end);
            }
        }
        let mut i = 0;
        while i != NONE {
            let piece = &s[start[i]..end[i]];
            if let Some(&id) = self.lookup.get(piece) {
                out.push(id);
            } else if let Some(bytes) = &self.byte_ids {
                out.extend(piece.bytes().map(|b| bytes[b as usize]));
            } else {
                out.push(0); // <unk>
            }
            i = next[i];
        }
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
        assert_eq!(v.encode("ab", false), vec![base + 4]);
        // 'é' is not in the vocabulary: two byte tokens
        let ids = v.encode("é", false);
        assert_eq!(ids, vec![base, 3 + 0xC3, 3 + 0xA9]);
        assert_eq!(v.decode(&ids), "é");
        assert_eq!(v.decode(&v.encode("ab ab", false)), "ab ab");
    }

    /// Verbatim tokens: longer ones claim the text first (even to the right
    /// of a shorter, overlapping one, as llama.cpp's partition does),
    /// control tokens only on request, and the dummy prefix is applied to
    /// every fragment that follows a verbatim token.
    #[test]
    fn verbatim_tokens_partition_the_text() {
        let mut pieces: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        pieces.extend((0..256).map(|b| format!("<0x{b:02X}>")));
        let base = pieces.len() as u32;
        pieces
            .extend(["\u{2581}", "a", "b", "c", "d", "x", "ab", "bcd", "<ctl>", "<", ">", "t", "l"].map(String::from));
        let names = pieces.clone();
        let id = |p: &str| names.iter().position(|q| q == p).unwrap() as u32;
        let (ab, bcd, ctl) = (id("ab"), id("bcd"), id("<ctl>"));
        let scores = vec![0.0; pieces.len()];
        let special: Vec<bool> = (0..pieces.len()).map(|i| i < 3 || i as u32 == ctl).collect();
        let v = ScoredVocab::new(pieces.clone(), scores.clone(), special.clone(), SpaceStyle::Metaspace, false)
            .with_verbatim(&[ab, bcd], &[ctl])
            .unwrap();
        // "bcd" (longer) wins over the "ab" that starts before it
        assert_eq!(v.encode("abcd", false), vec![id("a"), bcd]);
        assert_eq!(v.encode("abab", false), vec![ab, ab]);
        // control tokens only when parsing specials; they decode to nothing
        assert_eq!(v.encode("x<ctl>x", true), vec![id("x"), ctl, id("x")]);
        let plain = v.encode("x<ctl>x", false);
        assert!(!plain.contains(&ctl), "{plain:?}");
        assert_eq!(v.decode(&plain), "x<ctl>x");
        assert_eq!(v.decode(&v.encode("x<ctl>x", true)), "xx");
        // with a dummy prefix: at the start and after each verbatim token
        let v =
            ScoredVocab::new(pieces, scores, special, SpaceStyle::Metaspace, true).with_verbatim(&[], &[ctl]).unwrap();
        let sp = base;
        assert_eq!(v.encode("x<ctl>x", true), vec![sp, id("x"), ctl, sp, id("x")]);
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
            assert_eq!(v.encode(&text, false), naive(chars), "text {text:?}");
        }
    }
}
