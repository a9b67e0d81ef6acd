//! A sequence cache as bytes and back: what a saved compressed context
//! holds of its KV state. The kept K/V rows go out in their storage dtype
//! (codes and scales, never re-encoded: a quantized row encoded twice need
//! not come back the same), with each slot's original position and score
//! in slot order, the policy's own state ([`CachePolicy::save_state`]) and
//! the sequence counters. A cache restored from these bytes continues
//! exactly as the original would, bit for bit.
//!
//! Layout (little-endian; the caller frames it with its own header, model
//! fingerprint and checksum):
//!
//! ```text
//! u32 layers, kv_heads, head_dim; u8 dtype (0 f32, 1 f16, 2 q8, 3 q4); 3 zero bytes
//! u64 next_pos, steps_since_compact
//! u64 n, then n policy-state words (u64)
//! per layer, per KV head:
//!   u64 len; u32 positions[len]; f32 scores[len]
//!   per slot: K codes, K side values, V codes, V side values
//! ```
//!
//! A row's codes are padded to 4 bytes as the store keeps them, and its
//! side values (scales, Q4 minimums) follow as f32
//! ([`RowBuf::coded_sizes`]).

use super::{CacheShape, SequenceCache};
use crate::error::CacheError;
use crate::policy::PolicySpec;
use crate::store::{PagePool, RowBuf, RowIn};
use kvslim_kernels::kvquant::KvDtype;
use std::io::Write;

const DTYPES: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Q8, KvDtype::Q4];

impl SequenceCache {
    /// Writes the cache's state (see the module docs). Fails for state a
    /// file cannot carry yet: CHAI head sharing, a policy replaying another
    /// run, a pending prefill or an open checkpoint.
    pub fn save(&self, out: &mut impl Write) -> Result<(), CacheError> {
        let refuse = |why: &str| Err(CacheError::Persist(format!("this cache cannot be saved: {why}")));
        if self.sharing.is_some() {
            return refuse("CHAI head sharing (its clusters do not travel in a file yet)");
        }
        if !self.pending.is_empty() || self.checkpoint.is_some() {
            return refuse("it is in the middle of a step");
        }
        let mut words = Vec::new();
        self.policy
            .save_state(&mut words)
            .map_err(|e| CacheError::Persist(format!("this cache cannot be saved: {e}")))?;
        let store = &self.store;
        let dtype = store.head(0, 0).dtype();
        let code = DTYPES.iter().position(|&d| d == dtype).expect("every dtype has a code") as u8;
        let io = |e: std::io::Error| CacheError::Persist(format!("writing the cache: {e}"));
        let mut head = Vec::with_capacity(32);
        for n in [store.layers(), store.kv_heads(), store.head(0, 0).head_dim()] {
            head.extend_from_slice(&(n as u32).to_le_bytes());
        }
        head.extend_from_slice(&[code, 0, 0, 0]);
        for n in [self.next_pos as u64, self.steps_since_compact as u64, words.len() as u64] {
            head.extend_from_slice(&n.to_le_bytes());
        }
        out.write_all(&head).map_err(io)?;
        let mut buf = Vec::new();
        words.iter().for_each(|w| buf.extend_from_slice(&w.to_le_bytes()));
        out.write_all(&buf).map_err(io)?;
        for l in 0..store.layers() {
            for h in store.layer(l) {
                buf.clear();
                buf.extend_from_slice(&(h.len() as u64).to_le_bytes());
                h.positions().iter().for_each(|p| buf.extend_from_slice(&p.to_le_bytes()));
                h.scores().iter().for_each(|s| buf.extend_from_slice(&s.to_le_bytes()));
                for slot in 0..h.len() {
                    for keys in [true, false] {
                        let (codes, side) = h.coded_row(slot, keys).ok_or_else(|| {
                            CacheError::Persist(format!("layer {l}: a KV head without keys cannot be saved"))
                        })?;
                        buf.extend_from_slice(codes);
                        side.iter().for_each(|s| buf.extend_from_slice(&s.to_le_bytes()));
                    }
                }
                out.write_all(&buf).map_err(io)?;
            }
        }
        Ok(())
    }

    /// A cache for `spec` on a model of `shape` holding the state `bytes`
    /// describe ([`SequenceCache::save`]), with room for `max_len` tokens
    /// in all (budgets resolved against `base_len`, as when it was made).
    /// Every length and value is checked: a truncated, corrupted or
    /// foreign blob is an error naming what does not fit, never a panic.
    pub fn restore(
        spec: &PolicySpec,
        shape: CacheShape,
        (max_len, base_len): (usize, usize),
        pool: Option<&PagePool>,
        bytes: &[u8],
    ) -> Result<Self, CacheError> {
        let mut r = Reader { bytes, at: 0 };
        let (layers, kv_heads, head_dim) = (r.u32()? as usize, r.u32()? as usize, r.u32()? as usize);
        if (layers, kv_heads, head_dim) != (shape.layers, shape.kv_heads, shape.head_dim) {
            return Err(bad(format!(
                "it holds {layers} layers × {kv_heads} KV heads of {head_dim}; the model has {} × {} of {}",
                shape.layers, shape.kv_heads, shape.head_dim
            )));
        }
        let code = r.take(4)?[0];
        let dtype = *DTYPES.get(code as usize).ok_or_else(|| bad(format!("unknown KV dtype code {code}")))?;
        let want = spec.storage.layout().kv_dtype;
        if dtype != want {
            return Err(bad(format!("its rows are {dtype}, the policy `{spec}` stores {want}")));
        }
        let (next_pos, since_compact, n_words) = (r.u64()?, r.u64()?, r.u64()?);
        let words: Vec<u64> = (0..r.count(n_words, 8)?).map(|_| r.u64()).collect::<Result<_, _>>()?;
        if next_pos > max_len as u64 {
            return Err(bad(format!("it has seen {next_pos} tokens, more than the {max_len} asked for")));
        }
        let mut cache = SequenceCache::in_pool(spec, shape, max_len, base_len, pool)?;
        if cache.sharing.is_some() {
            return Err(bad("CHAI head sharing cannot be restored from a file yet".into()));
        }
        let mut rest = &words[..];
        cache.policy.load_state(&mut rest).map_err(bad)?;
        if !rest.is_empty() {
            return Err(bad(format!("{} policy-state words are left over", rest.len())));
        }
        cache.next_pos = next_pos as usize;
        cache.steps_since_compact = since_compact as usize;
        if spec.alloc().global && !cache.policy.global_decision_pending() {
            // made for the whole sequence; its shares are known
            cache.shrink_heads_to_budgets();
        }
        let (code_bytes, side_count) = RowBuf::coded_sizes(dtype, head_dim);
        let row_bytes = code_bytes + 4 * side_count;
        let mut side = (vec![0f32; side_count], vec![0f32; side_count]);
        for l in 0..layers {
            for h in 0..kv_heads {
                let len = r.u64()?;
                let len = r.count(len, 8 + 2 * row_bytes)?;
                let capacity = cache.store.head(l, h).capacity();
                if len > capacity {
                    return Err(bad(format!(
                        "layer {l} KV head {h} holds {len} slots; the policy gives it {capacity}"
                    )));
                }
                let positions = r.take(4 * len)?;
                let scores = r.take(4 * len)?;
                let head = cache.store.head_mut(l, h);
                for s in 0..len {
                    let pos = u32::from_le_bytes(positions[4 * s..4 * s + 4].try_into().expect("4 bytes"));
                    if pos as usize >= cache.next_pos {
                        return Err(bad(format!(
                            "layer {l} KV head {h} keeps position {pos}, not among the {} tokens seen",
                            cache.next_pos
                        )));
                    }
                    let score = f32::from_le_bytes(scores[4 * s..4 * s + 4].try_into().expect("4 bytes"));
                    let k = r.take(row_bytes)?;
                    let v = r.take(row_bytes)?;
                    let key = coded(k, code_bytes, &mut side.0);
                    let value = coded(v, code_bytes, &mut side.1);
                    head.push_coded(pos, score, key, value).expect("len checked against the capacity");
                }
            }
        }
        if r.at != bytes.len() {
            return Err(bad(format!("{} bytes follow the last head", bytes.len() - r.at)));
        }
        Ok(cache)
    }
}

/// A saved row: its codes, then side values decoded into `side`.
fn coded<'a>(row: &'a [u8], code_bytes: usize, side: &'a mut [f32]) -> RowIn<'a> {
    let (codes, rest) = row.split_at(code_bytes);
    for (s, b) in side.iter_mut().zip(rest.chunks_exact(4)) {
        *s = f32::from_le_bytes(b.try_into().expect("4 bytes"));
    }
    RowIn::Coded { codes, side }
}

fn bad(why: String) -> CacheError {
    CacheError::Persist(format!("the saved cache does not fit: {why}"))
}

/// Reads the blob front to back; every read checks the length left.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CacheError> {
        let left = self.bytes.len() - self.at;
        if n > left {
            return Err(bad(format!("it ends early ({n} bytes wanted at byte {}, {left} left)", self.at)));
        }
        self.at += n;
        Ok(&self.bytes[self.at - n..self.at])
    }

    fn u32(&mut self) -> Result<u32, CacheError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, CacheError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// `n` items of at least `each` bytes: refused when the bytes left
    /// cannot hold them (a corrupted count must not allocate terabytes).
    fn count(&self, n: u64, each: usize) -> Result<usize, CacheError> {
        let left = (self.bytes.len() - self.at) as u64;
        if n.saturating_mul(each as u64) > left {
            return Err(bad(format!("a count of {n} does not fit the {left} bytes left")));
        }
        Ok(n as usize)
    }
}
