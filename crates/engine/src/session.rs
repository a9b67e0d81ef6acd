//! One sequence being run: the model, its KV cache and scratch buffers.

use kvslim_cache::{KvBytes, PagePool, PolicySpec, SequenceCache};
use kvslim_models::transformer::{BatchItem, BatchScratch, PrefillRun};
use kvslim_models::{Logits, Model, Scratch};
use std::ops::Range;

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
    /// Fails when the policy does not fit the model (a CHAI plan for
    /// another model).
    pub fn new(model: &'m Model, policy: &PolicySpec, max_len: usize, base_len: usize) -> kvslim_models::Result<Self> {
        Self::in_pool(model, policy, max_len, base_len, None)
    }

    /// As [`Session::new`], drawing KV pages from a shared pool (see
    /// [`kvslim_cache::PagePool`]).
    pub fn in_pool(
        model: &'m Model,
        policy: &PolicySpec,
        max_len: usize,
        base_len: usize,
        pool: Option<&PagePool>,
    ) -> kvslim_models::Result<Self> {
        Ok(Self::with_cache(model, model.new_cache_in(policy, max_len, base_len, pool)?))
    }

    /// A session continuing an existing cache (a fork: a beam, or a request
    /// reusing a cached prompt; paged K/V stay shared until written).
    pub fn with_cache(model: &'m Model, cache: SequenceCache) -> Self {
        Session { model, cache, scratch: Scratch::new(), chunked_logits: Vec::new() }
    }

    /// Runs a chunk of tokens (prefill when longer than one). A policy with
    /// streaming prefill gets the prompt in its own chunk size, and online
    /// CHAI gets its probe as a chunk of its own so clustering happens right
    /// after the probe's last token.
    pub fn feed(&mut self, tokens: &[u32], want: Logits) -> kvslim_models::Result<&[f32]> {
        if self.one_part(tokens.len()) {
            self.model.forward(tokens, &mut self.cache, &mut self.scratch, want)?;
            return Ok(self.scratch.logits());
        }
        let parts = self.feed_parts(tokens.len());
        self.chunked_logits.clear();
        let pieces = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            let w = part_logits(want, i + 1 == pieces);
            self.model.forward(&tokens[part], &mut self.cache, &mut self.scratch, w)?;
            if want == Logits::All {
                self.chunked_logits.extend_from_slice(self.scratch.logits());
            }
        }
        Ok(if want == Logits::All { &self.chunked_logits } else { self.scratch.logits() })
    }

    /// The chunks [`Session::feed`] runs `len` tokens in: the policy's
    /// streaming chunk size, online CHAI's probe on its own; one range when
    /// neither applies.
    fn feed_parts(&self, len: usize) -> Vec<Range<usize>> {
        if self.one_part(len) {
            return std::iter::once(0..len).collect();
        }
        let (chunk, probe_cut) = self.cuts();
        let head = probe_cut.min(len);
        let split = |from: usize, to: usize| (from..to).step_by(chunk).map(move |a| a..a.saturating_add(chunk).min(to));
        split(0, head).chain(split(head, len)).collect()
    }

    /// The streaming chunk size and where online CHAI's probe ends
    /// (`usize::MAX`: no limit).
    fn cuts(&self) -> (usize, usize) {
        let chunk = self.cache.prefill_chunk().unwrap_or(usize::MAX).max(1);
        let probe_cut = match self.cache.probe_remaining() {
            0 => usize::MAX,
            left => left,
        };
        (chunk, probe_cut)
    }

    /// Whether `len` tokens run as one chunk (no allocation: decode steps
    /// come through here).
    fn one_part(&self, len: usize) -> bool {
        let (chunk, probe_cut) = self.cuts();
        len <= chunk && len <= probe_cut
    }

    /// Starts feeding `tokens` as [`Session::feed`] would, to be run a
    /// slice at a time with [`Session::feed_some`]: a server interleaves
    /// other sequences' decode steps with a long prompt's prefill this way.
    /// The result is bit-identical to one [`Session::feed`]. Until it is
    /// done, nothing else may feed this session.
    pub fn begin_feed(&mut self, tokens: Vec<u32>, want: Logits) -> Feed {
        let parts = self.feed_parts(tokens.len());
        self.start_feed(tokens, parts, want)
    }

    /// A feed of `tokens` in `parts`, nothing run yet.
    fn start_feed(&mut self, tokens: Vec<u32>, parts: Vec<Range<usize>>, want: Logits) -> Feed {
        self.chunked_logits.clear();
        Feed { tokens, parts, part: 0, run: None, want }
    }

    /// Starts feeding `tokens` in chunks that can each share a pass with
    /// other sequences' decode steps ([`Session::feed_mixed`]), or `None`
    /// where they cannot: a cache that keeps every token is cut into chunks
    /// of about `chunk` tokens ([`Session::begin_feed_chunked`]); under a
    /// policy that must see its chunks whole (H2O's scores, SnapKV's
    /// window) the prompt runs in that policy's own chunks when none is
    /// longer than `WHOLE_CHUNKS` × `chunk` tokens (a pass stalls the
    /// decoding sequences for about that long); a KVzip or CHAI probe never
    /// mixes. The result is what [`Session::begin_feed`] with
    /// [`Session::feed_some`] gives, up to the rounding of other chunk cuts
    /// (a cache that keeps every token only).
    pub fn begin_feed_mixed(&mut self, tokens: &[u32], want: Logits, chunk: usize) -> Option<Feed> {
        if self.cache.repeat_probe().is_some() || self.cache.probe_remaining() > 0 {
            return None;
        }
        let parts = if self.cache.prefill_chunkable() {
            self.chunked_parts(tokens.len(), chunk)
        } else {
            let parts = self.feed_parts(tokens.len());
            if parts.iter().any(|p| p.len() > WHOLE_CHUNKS.saturating_mul(chunk)) {
                return None;
            }
            parts
        };
        Some(self.start_feed(tokens.to_vec(), parts, want))
    }

    /// As [`Session::begin_feed`], every chunk cut to about `chunk`
    /// tokens, so that [`Session::feed_mixed`] can run it a chunk per pass.
    /// A last piece of one token joins the one before (one token would run
    /// the decode step's arithmetic, slightly different from a chunk's).
    /// Only for a cache that [`SequenceCache::prefill_chunkable`]: under
    /// any other policy more chunks would change what the policy keeps.
    pub fn begin_feed_chunked(&mut self, tokens: Vec<u32>, want: Logits, chunk: usize) -> Feed {
        let parts = self.chunked_parts(tokens.len(), chunk);
        self.start_feed(tokens, parts, want)
    }

    /// [`Session::feed_parts`] cut to `chunk` tokens, a last piece of one
    /// token joined to the one before.
    fn chunked_parts(&self, len: usize, chunk: usize) -> Vec<Range<usize>> {
        let chunk = chunk.max(1);
        let mut parts = Vec::new();
        for r in self.feed_parts(len) {
            let first = parts.len();
            parts.extend((r.start..r.end).step_by(chunk).map(|a| a..(a + chunk).min(r.end)));
            if chunk > 1 && parts.len() > first + 1 && parts.last().is_some_and(|p| p.len() == 1) {
                let end = parts.pop().expect("checked").end;
                parts.last_mut().expect("checked").end = end;
            }
        }
        parts
    }

    /// Runs the next chunk of `feed` whole and, in the same pass, one
    /// decode step for each of `items` ([`Model::forward_mixed`]: their
    /// logits in `batch.logits(i)`); returns whether the feed is done. The
    /// feed must be between chunks (not inside a [`Session::feed_some`]
    /// slice).
    pub fn feed_mixed(
        &mut self,
        feed: &mut Feed,
        items: &mut [BatchItem<'_>],
        batch: &mut BatchScratch,
    ) -> kvslim_models::Result<bool> {
        if feed.run.is_some() {
            return Err(kvslim_models::Error::Unsupported(
                "a chunk already started layer by layer cannot share its pass with decode steps".into(),
            ));
        }
        let Some(range) = feed.parts.get(feed.part).cloned() else {
            return self.model.forward_batch(items, batch).map(|()| true);
        };
        let want = part_logits(feed.want, feed.part + 1 == feed.parts.len());
        self.model.forward_mixed((&feed.tokens[range], &mut self.cache, &mut self.scratch, want), items, batch)?;
        feed.part += 1;
        if feed.want == Logits::All && feed.parts.len() > 1 {
            self.chunked_logits.extend_from_slice(self.scratch.logits());
        }
        Ok(feed.part == feed.parts.len())
    }

    /// Runs about `budget` token-layers of `feed` (whole layers of a chunk,
    /// at least one): returns whether the feed is done (its logits then in
    /// [`Session::fed_logits`]) and the token-layers it ran.
    pub fn feed_some(&mut self, feed: &mut Feed, budget: usize) -> kvslim_models::Result<(bool, usize)> {
        let mut used = 0;
        while feed.part < feed.parts.len() {
            let last = feed.part + 1 == feed.parts.len();
            let want = part_logits(feed.want, last);
            let run = match feed.run.as_mut() {
                Some(run) => run,
                None => {
                    let range = feed.parts[feed.part].clone();
                    let run =
                        self.model.prefill_begin(&feed.tokens[range], &mut self.cache, &mut self.scratch, want)?;
                    feed.run.insert(run)
                }
            };
            let rows = run.rows().max(1);
            let before = run.layers_done();
            let layers = (budget.saturating_sub(used) / rows).max(1);
            let done = self.model.prefill_layers(run, &mut self.cache, &mut self.scratch, layers)?;
            used += (run.layers_done() - before) * rows;
            if !done {
                return Ok((false, used));
            }
            feed.run = None;
            feed.part += 1;
            if feed.want == Logits::All && feed.parts.len() > 1 {
                self.chunked_logits.extend_from_slice(self.scratch.logits());
            }
            if used >= budget {
                break;
            }
        }
        Ok((feed.part == feed.parts.len(), used))
    }

    /// The logits of a finished [`Feed`], as [`Session::feed`] returns them.
    pub fn fed_logits(&self, feed: &Feed) -> &[f32] {
        if feed.want == Logits::All && feed.parts.len() > 1 {
            &self.chunked_logits
        } else {
            self.scratch.logits()
        }
    }

    /// Position of the next token.
    pub fn position(&self) -> usize {
        self.cache.next_pos()
    }

    /// Allocated KV and metadata bytes.
    pub fn kv_bytes(&self) -> KvBytes {
        self.cache.store().bytes()
    }
}

/// How many mixed chunks' worth of tokens a prompt that cannot be cut may
/// have and still share a pass with decode steps whole
/// ([`Session::begin_feed_mixed`]).
pub const WHOLE_CHUNKS: usize = 4;

/// Which logits chunk `i` of a feed wanting `want` computes: all of them
/// for [`Logits::All`], the last row of the last chunk for [`Logits::Last`].
fn part_logits(want: Logits, last: bool) -> Logits {
    match want {
        Logits::All => Logits::All,
        Logits::Last if last => Logits::Last,
        _ => Logits::None,
    }
}

/// A feed in progress ([`Session::begin_feed`]): the tokens, the chunks
/// they run in and the chunk (and layer) reached.
pub struct Feed {
    tokens: Vec<u32>,
    parts: Vec<Range<usize>>,
    part: usize,
    run: Option<PrefillRun>,
    want: Logits,
}

impl Feed {
    /// The tokens being fed.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
}
