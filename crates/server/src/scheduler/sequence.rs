//! A sequence in the running batch: its session, sampler and output; what
//! a sampled token does to it, and what its end reports and frees.

use super::events::{token_logprob, Event, Finish, TokenLogprob};
use super::pools::full_kv_bytes;
use super::request::Request;
use super::speculation::Speculation;
use super::streaming::{Piece, TextStream};
use crate::metrics::Metrics;
use kvslim_engine::{Sampler, Session};
use kvslim_models::Tokenizer;
use std::sync::atomic::Ordering::Relaxed;

/// A sequence in the running batch.
pub(super) struct Running<'m> {
    pub session: Session<'m>,
    pub sampler: Sampler,
    pub req: Request,
    /// Token to feed at the next decode step.
    pub next: u32,
    pub out: TextStream,
    pub finished: Option<&'static str>,
    pub cancelled: bool,
    /// Stopped at its deadline (the client was told; no `Done` follows).
    pub timed_out: bool,
    /// Prompt tokens that came from the prefix cache.
    pub reused: usize,
    /// Speculative decoding's state, from its first speculative step on.
    pub spec: Option<Box<Speculation<'m>>>,
}

impl<'m> Running<'m> {
    /// A sequence about to start (its prompt fed or about to be).
    pub fn new(session: Session<'m>, req: Request, reused: usize) -> Self {
        Running {
            session,
            sampler: Sampler::new(req.sampling.clone()),
            req,
            next: 0,
            out: TextStream::new(),
            finished: None,
            cancelled: false,
            timed_out: false,
            reused,
            spec: None,
        }
    }

    /// Whether it leaves the batch at the end of this step.
    pub fn ended(&self) -> bool {
        self.finished.is_some() || self.cancelled || self.timed_out
    }

    /// Samples the first token from the prompt's last logits; `None` when
    /// that already ends the request (its KV then freed).
    pub fn start(mut self, tok: &Tokenizer, m: &Metrics, logits: &[f32]) -> Option<Self> {
        if self.req.max_tokens == 0 || self.cancelled {
            // `echo` with max_tokens 0: the prompt (and its log-probs) is all
            if !self.cancelled {
                self.finished = Some("length");
            }
            self.release(m);
            return None;
        }
        let first = self.sampler.sample(logits);
        let lp = self.req.logprobs.map(|k| token_logprob(logits, first, k));
        self.on_token(tok, m, first, lp);
        if self.finished.is_some() || self.cancelled {
            self.release(m);
            return None;
        }
        Some(self)
    }

    /// Handles a sampled token (and its log-prob, when asked for): the
    /// text it completes goes to the client, and EOS, a stop string or
    /// `max_tokens` finish the request.
    pub fn on_token(&mut self, tok: &Tokenizer, m: &Metrics, id: u32, lp: Option<TokenLogprob>) {
        let step = self.out.push(tok, id, lp, &self.req.stop, self.req.max_tokens);
        if !tok.is_eos(id) {
            self.next = id;
            m.generated_tokens_total.fetch_add(1, Relaxed);
        }
        if let Some(piece) = step.piece {
            self.send(piece);
        }
        if step.finish.is_some() {
            self.finished = step.finish;
        }
    }

    /// Sends whatever text is left unsent (see [`TextStream::flush`]).
    pub fn flush(&mut self, tok: &Tokenizer) {
        if let Some(piece) = self.out.flush(tok) {
            self.send(piece);
        }
    }

    fn send(&mut self, piece: Piece) {
        if self.req.events.send(Event::Text(piece.text, piece.logprobs)).is_err() {
            self.cancelled = true;
        }
    }

    /// Frees the KV reservation and reports the end.
    pub fn release(&mut self, m: &Metrics) {
        m.kv_bytes_in_use.fetch_sub(self.req.kv_bytes, Relaxed);
        let store = &self.session.cache.store();
        let pos = self.session.cache.next_pos();
        let mut evicted = 0u64;
        for l in 0..store.layers() {
            for h in 0..store.kv_heads() {
                evicted += pos.saturating_sub(store.head(l, h).len()) as u64;
            }
        }
        m.evicted_slots_total.fetch_add(evicted, Relaxed);
        if self.cancelled {
            m.requests_cancelled_total.fetch_add(1, Relaxed);
        }
        if let Some(reason) = self.finished {
            let _ = self.req.events.send(Event::Done(Finish {
                reason,
                prompt_tokens: self.req.prompt.len(),
                completion_tokens: self.out.generated().len(),
                kv_bytes: self.req.kv_bytes,
                prompt_tokens_reused: self.reused,
                kv_bytes_final: self.session.kv_bytes().kv,
                kv_bytes_full: full_kv_bytes(self.session.model, pos),
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{events, outcome, prefilled, request, tiny_model, tokenizer, HEL};

    /// Logits that make greedy sampling pick `id`.
    fn peak(id: u32) -> Vec<f32> {
        let mut row = vec![0.0; 16];
        row[id as usize] = 10.0;
        row
    }

    #[test]
    fn the_first_token_is_sampled_and_sent() {
        let (model, tok, m) = (tiny_model(), tokenizer(), Metrics::default());
        let (mut req, mut rx) = request(vec![1, 11, 12], 4);
        req.logprobs = Some(1);
        let (r, _) = prefilled(&model, req);
        let r = r.start(&tok, &m, &peak(HEL)).expect("still running");
        assert_eq!((r.next, r.out.generated()), (HEL, &[HEL][..]));
        match events(&mut rx).as_slice() {
            [Event::Text(t, lps)] => assert_eq!((t.as_str(), lps[0].id, lps[0].top[0].0), ("Hel", HEL, HEL)),
            other => panic!("{other:?}"),
        }
        assert_eq!(m.generated_tokens_total.load(Relaxed), 1);
    }

    #[test]
    fn max_tokens_zero_ends_at_once_and_frees_the_reservation() {
        let (model, tok, m) = (tiny_model(), tokenizer(), Metrics::default());
        let (req, mut rx) = request(vec![1, 11, 12], 0);
        m.kv_bytes_in_use.store(req.kv_bytes, Relaxed);
        let (r, logits) = prefilled(&model, req);
        assert!(r.start(&tok, &m, &logits).is_none());
        assert_eq!(m.kv_bytes_in_use.load(Relaxed), 0);
        let ev = events(&mut rx);
        assert_eq!(outcome(&ev), (String::new(), Some(("length", 0))));
        match &ev[0] {
            Event::Done(f) => {
                assert_eq!((f.prompt_tokens, f.kv_bytes, f.prompt_tokens_reused), (3, 1000, 0));
                assert_eq!(f.kv_bytes_full, full_kv_bytes(&model, 3));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn eos_finishes_with_stop() {
        let (model, tok, m) = (tiny_model(), tokenizer(), Metrics::default());
        let (req, mut rx) = request(vec![1, 11], 8);
        let (mut r, _) = prefilled(&model, req);
        r.on_token(&tok, &m, HEL, None);
        r.on_token(&tok, &m, tok.eos[0], None);
        assert_eq!((r.finished, r.next), (Some("stop"), HEL), "EOS is never fed");
        r.release(&m);
        assert_eq!(outcome(&events(&mut rx)), ("Hel".into(), Some(("stop", 1))));
    }

    #[test]
    fn a_client_gone_cancels_and_reports_nothing() {
        let (model, tok, m) = (tiny_model(), tokenizer(), Metrics::default());
        let (req, rx) = request(vec![1, 11], 8);
        drop(rx);
        let (mut r, _) = prefilled(&model, req);
        r.on_token(&tok, &m, HEL, None);
        assert!(r.cancelled && r.ended());
        r.release(&m);
        assert_eq!(m.requests_cancelled_total.load(Relaxed), 1);
    }
}
