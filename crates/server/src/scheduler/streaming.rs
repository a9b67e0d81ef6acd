//! A request's output on its way to the client: tokens become complete
//! UTF-8 text, cut at the first stop string, with a tail that could start
//! one held back until the next token tells; each generated token's
//! log-prob travels with the text it starts in.

use super::events::TokenLogprob;
use kvslim_models::tokenizer::StreamDecoder;
use kvslim_models::Tokenizer;
use std::collections::VecDeque;

/// The generated tokens, their text and how much of it was sent.
pub(super) struct TextStream {
    generated: Vec<u32>,
    /// The generated text so far (complete UTF-8 only), decoded token by
    /// token without re-decoding the whole output each step.
    text: String,
    decoder: StreamDecoder,
    /// Bytes of `text` already sent.
    sent: usize,
    /// Log-probs of generated tokens not sent yet, each with the byte
    /// offset in `text` where its piece starts.
    pending: VecDeque<(usize, TokenLogprob)>,
}

/// Text for the client and the log-probs of the tokens that start in it
/// (never both empty).
#[derive(Debug, PartialEq)]
pub(super) struct Piece {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
}

/// What one token did: the piece to send now, and why the request ends
/// when it does (`stop` or `length`).
#[derive(Debug, PartialEq)]
pub(super) struct Step {
    pub piece: Option<Piece>,
    pub finish: Option<&'static str>,
}

impl TextStream {
    pub fn new() -> Self {
        TextStream {
            generated: Vec::new(),
            text: String::new(),
            decoder: StreamDecoder::new(),
            sent: 0,
            pending: VecDeque::new(),
        }
    }

    /// The generated tokens (EOS not included).
    pub fn generated(&self) -> &[u32] {
        &self.generated
    }

    /// Takes a sampled token (and its log-prob, when asked for): EOS, text
    /// with stop strings, `max_tokens`.
    pub fn push(
        &mut self,
        tok: &Tokenizer,
        id: u32,
        lp: Option<TokenLogprob>,
        stop: &[String],
        max_tokens: usize,
    ) -> Step {
        if let Some(lp) = lp {
            self.pending.push_back((self.text.len(), lp));
        }
        if tok.is_eos(id) {
            return Step { piece: self.flush(tok), finish: Some("stop") };
        }
        self.generated.push(id);
        let piece = self.decoder.push(tok, id).unwrap_or_default();
        self.text.push_str(&piece);
        if let Some(end) = self.stop_at(stop) {
            let piece = self.take(end);
            // tokens starting inside the stop string are not reported
            self.pending.clear();
            return Step { piece, finish: Some("stop") };
        }
        if self.generated.len() >= max_tokens {
            return Step { piece: self.flush(tok), finish: Some("length") };
        }
        let end = self.text.len() - self.held_back(stop);
        let piece = if end > self.sent { self.take(end) } else { None };
        Step { piece, finish: None }
    }

    /// Whatever text is left unsent: the whole output decoded once, so
    /// bytes of a character the stream still held back come out too; every
    /// pending log-prob goes with it.
    pub fn flush(&mut self, tok: &Tokenizer) -> Option<Piece> {
        let text = tok.decode(&self.generated).unwrap_or_default();
        let rest = if text.len() > self.sent && text.is_char_boundary(self.sent) {
            let p = text[self.sent..].to_string();
            self.sent = text.len();
            p
        } else {
            String::new()
        };
        self.piece(rest, usize::MAX)
    }

    /// Where the earliest complete stop string in the unsent text starts
    /// (searched from a little before it, in case a stop string straddles
    /// the boundary).
    fn stop_at(&self, stop: &[String]) -> Option<usize> {
        let text = &self.text;
        let mut search = self.sent.saturating_sub(stop.iter().map(String::len).max().unwrap_or(0));
        while !text.is_char_boundary(search) {
            search -= 1;
        }
        let at = stop.iter().filter(|s| !s.is_empty()).filter_map(|s| text[search..].find(s.as_str())).min()?;
        Some((search + at).max(self.sent))
    }

    /// Bytes at the end of the text that could be the start of a stop
    /// string.
    fn held_back(&self, stop: &[String]) -> usize {
        stop.iter()
            .flat_map(|s| (1..s.len()).filter(|&k| s.is_char_boundary(k) && self.text.ends_with(&s[..k])))
            .max()
            .unwrap_or(0)
    }

    /// The unsent text up to byte `end`, marked sent.
    fn take(&mut self, end: usize) -> Option<Piece> {
        let text = self.text[self.sent..end].to_string();
        self.sent = end;
        self.piece(text, end)
    }

    /// `text` with the pending log-probs of tokens starting before byte
    /// `end` of the output; `None` when both are empty.
    fn piece(&mut self, text: String, end: usize) -> Option<Piece> {
        let mut logprobs = Vec::new();
        while self.pending.front().is_some_and(|(start, _)| *start < end) {
            logprobs.push(self.pending.pop_front().expect("checked").1);
        }
        (!text.is_empty() || !logprobs.is_empty()).then_some(Piece { text, logprobs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{tokenizer, EOS, EURO, HEL, LO, WOR};

    fn lp(id: u32) -> TokenLogprob {
        TokenLogprob { id, logprob: -(id as f64), top: Vec::new() }
    }

    /// Feeds `ids` (each with its log-prob) and returns every step.
    fn run(ids: &[u32], stop: &[&str], max_tokens: usize) -> Vec<Step> {
        let tok = tokenizer();
        let stop: Vec<String> = stop.iter().map(|s| s.to_string()).collect();
        let mut s = TextStream::new();
        ids.iter().map(|&id| s.push(&tok, id, Some(lp(id)), &stop, max_tokens)).collect()
    }

    fn text(steps: &[Step]) -> String {
        steps.iter().filter_map(|s| s.piece.as_ref()).map(|p| p.text.as_str()).collect()
    }

    fn piece(text: &str, ids: &[u32]) -> Option<Piece> {
        Some(Piece { text: text.into(), logprobs: ids.iter().map(|&i| lp(i)).collect() })
    }

    #[test]
    fn a_character_split_over_tokens_goes_out_whole_with_its_tokens() {
        let steps = run(&[HEL, EURO[0], EURO[1], EURO[2], LO], &[], 16);
        assert_eq!(steps[0].piece, piece("Hel", &[HEL]));
        assert_eq!((&steps[1].piece, &steps[2].piece), (&None, &None), "nothing until the character is complete");
        assert_eq!(steps[3].piece, piece("€", &EURO));
        assert_eq!(steps[4].piece, piece("lo", &[LO]));
        assert!(steps.iter().all(|s| s.finish.is_none()));
    }

    #[test]
    fn a_stop_string_spanning_tokens_cuts_the_text_before_it() {
        let steps = run(&[HEL, LO, WOR], &["lo wor"], 16);
        // "l" and "lo" could start the stop string: held back
        assert_eq!(steps[0].piece, piece("He", &[HEL]));
        assert_eq!(steps[1].piece, piece("l", &[]));
        // the token starting inside the stop string is not reported
        assert_eq!(steps[2], Step { piece: None, finish: Some("stop") });
        assert_eq!(text(&steps), "Hel");
    }

    #[test]
    fn a_multibyte_stop_string_holds_back_whole_characters() {
        let steps = run(&[HEL, EURO[0], EURO[1], EURO[2], LO, WOR], &["€lo!"], 16);
        assert_eq!(steps[0].piece, piece("Hel", &[HEL]));
        // "€" and "€lo" may start the stop string; " wor" rules it out
        assert!(steps[1..5].iter().all(|s| s.piece.is_none()), "{steps:?}");
        assert_eq!(steps[5].piece, piece("€lo wor", &[EURO[0], EURO[1], EURO[2], LO, WOR]));
        assert_eq!(text(&run(&[HEL, EURO[0], EURO[1], EURO[2]], &["l€"], 16)), "He");
    }

    #[test]
    fn eos_flushes_the_held_back_tail_with_its_own_logprob() {
        let steps = run(&[HEL, LO, EOS], &["lo!"], 16);
        assert_eq!(text(&steps[..2]), "Hel");
        assert_eq!(steps[2], Step { piece: piece("lo", &[LO, EOS]), finish: Some("stop") });
    }

    #[test]
    fn max_tokens_ends_with_length_and_flushes_an_unfinished_character() {
        let steps = run(&[HEL, EURO[0]], &[], 2);
        assert_eq!(steps[1].finish, Some("length"));
        // the whole output decoded once: the lone byte comes out replaced
        assert_eq!(text(&steps), "Hel\u{fffd}");
        let mut s = TextStream::new();
        let tok = tokenizer();
        s.push(&tok, HEL, None, &[], 1);
        assert_eq!(s.generated(), [HEL]);
        assert_eq!(s.flush(&tok), None, "nothing left: nothing to send");
    }
}
