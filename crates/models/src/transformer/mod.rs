//! The forward pass shared by every architecture: embeddings → blocks
//! (norm, attention over the cache's slots, MLP) → final norm → logits.
//!
//! One call processes a chunk of tokens: n = 1 is a decode step (GEMV), n > 1
//! a prefill (GEMM). All scratch memory lives in [`Scratch`], allocated on
//! the first call and reused, so decode steps do not allocate. The model
//! only computes: the KV state belongs to [`SequenceCache`], whose per-step
//! methods it calls (append, read views, after-attention, prefill
//! candidates and commit).
//!
//! * [`forward`]: the entry points;
//! * [`block`]: the steps they share (checks, embedding, RoPE, Q/K/V, W_O + MLP, logits);
//! * [`mixed`]: a prefill chunk and a batch of decode steps in one pass;
//! * [`decode`] and [`prefill`]: attention of one layer for one token or a chunk;
//! * [`probe`]: KVzip's repeat probe after a chunk (its rows and pieces);
//! * [`scratch`] and [`trace`]: buffers and the optional record of a call.

mod block;
mod decode;
mod expected;
mod forward;
mod mixed;
mod prefill;
mod probe;
mod scratch;
mod trace;

pub use forward::{BatchItem, PrefillRun, StepsItem};
pub use probe::{ProbeSegment, PROBE_SINKS, REPEAT_INSTRUCTION, REPEAT_PART_INSTRUCTION};
pub use scratch::{BatchScratch, Scratch};
pub use trace::Trace;

use crate::config::ModelConfig;
use crate::kvzap::{find_kvzap, KvzapPredictor};
use crate::weights::Weights;
use crate::{Error, Result};
use kvslim_cache::{CacheShape, PrefillKernel, SequenceCache};
use kvslim_kernels::attention::MAX_HEAD_DIM;
use kvslim_kernels::rope::Rope;

/// Which logits a forward call should produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (pure prefill of a prompt prefix).
    None,
    /// Only the last token's (generation).
    Last,
    /// Every token's (teacher forcing, parity tests).
    All,
}

/// A loaded model ready to run.
pub struct Model {
    pub config: ModelConfig,
    pub weights: Weights,
    /// RoPE per kind: `[global]`, or `[global, local]` when sliding-window
    /// layers use their own base (Gemma 3).
    ropes: Vec<Rope>,
    /// Per layer, its index into `ropes`.
    layer_rope: Vec<usize>,
    /// KVzip's reconstruction instruction (`prefill=kvzip`): tokens fed
    /// between the prompt and its repeat, so the model is asked to repeat
    /// its context as in the paper. Set by [`crate::load_model`] from the
    /// model's tokenizer ([`REPEAT_INSTRUCTION`]); empty for a model
    /// without one (the repeat then follows the prompt directly).
    pub repeat_prompt: Vec<u32>,
    /// The instruction before every later piece of the repeat
    /// ([`REPEAT_PART_INSTRUCTION`], then the previous piece's last
    /// tokens); set with `repeat_prompt`.
    pub repeat_part_prompt: Vec<u32>,
    /// KVzap predictors (`prefill=kvzap[:FILE]`) read so far, by the file
    /// the spec names (`None`: the model's own, found by fingerprint):
    /// each file is read and checked once ([`Model::kvzap_predictor`]).
    kvzap: std::sync::Mutex<Vec<(Option<&'static str>, std::sync::Arc<KvzapPredictor>)>>,
    /// Whether the model's own predictor is found and fits, looked up once
    /// ([`Model::has_kvzap`]): every cache's shape asks.
    own_kvzap: std::sync::OnceLock<bool>,
}

impl Model {
    /// Checks that weights match the config and precomputes RoPE tables.
    pub fn new(config: ModelConfig, weights: Weights) -> Result<Self> {
        config.validate().map_err(Error::InvalidModel)?;
        weights.check_against(&config)?;
        let c = &config;
        let max_hd = MAX_HEAD_DIM;
        if c.head_dim > max_hd {
            let reason = format!("head_dim {} exceeds the {max_hd} the attention kernel supports", c.head_dim);
            return Err(Error::InvalidModel(reason));
        }
        let bf16 = weights.token_embedding.dtype() == kvslim_kernels::DType::BF16;
        let make_rope = |r: crate::config::RopeConfig, theta: f32| {
            let rope = Rope::new(theta, r.rotary_dim, r.layout);
            if bf16 {
                rope.with_bf16_frequencies()
            } else {
                rope
            }
        };
        let mut ropes = Vec::new();
        let mut layer_rope = vec![0; c.n_layers];
        if let Some(r) = config.rope {
            ropes.push(make_rope(r, r.theta));
            if let Some(w) = &c.features.sliding_window {
                if let Some(theta) = w.local_rope_theta {
                    ropes.push(make_rope(r, theta));
                    for (l, &local) in w.local_layers.iter().enumerate() {
                        layer_rope[l] = usize::from(local);
                    }
                }
            }
        }
        Ok(Model {
            config,
            weights,
            ropes,
            layer_rope,
            repeat_prompt: Vec::new(),
            repeat_part_prompt: Vec::new(),
            kvzap: Default::default(),
            own_kvzap: Default::default(),
        })
    }

    /// A cache for one sequence of at most `max_len` tokens under `spec`.
    /// Percentage budgets resolve against `base_len` (prompt length for
    /// generation, sequence length for perplexity).
    /// Fails when a CHAI plan does not match this model.
    pub fn new_cache(&self, spec: &kvslim_cache::PolicySpec, max_len: usize, base_len: usize) -> Result<SequenceCache> {
        self.new_cache_in(spec, max_len, base_len, None)
    }

    /// As [`Model::new_cache`], with pages drawn from a shared pool (which
    /// must match the spec's page size and KV dtype).
    pub fn new_cache_in(
        &self,
        spec: &kvslim_cache::PolicySpec,
        max_len: usize,
        base_len: usize,
        pool: Option<&kvslim_cache::PagePool>,
    ) -> Result<SequenceCache> {
        if let Some(file) = spec.kvzap() {
            // a missing or mismatched predictor fails here, not mid-prefill
            self.kvzap_predictor(file)?;
        }
        Ok(SequenceCache::in_pool(spec, self.cache_shape(), max_len.min(self.config.context_len), base_len, pool)?)
    }

    /// A short name of these exact weights, for files that only fit them
    /// (saved contexts): the architecture and sizes, then a CRC-32 of the
    /// configuration and of 64 rows of the token embedding (dequantized,
    /// so the same whatever products the weights were packed for), which
    /// tells fine-tunes and quantizations of one architecture apart
    /// without reading the whole file.
    pub fn fingerprint(&self) -> String {
        let c = &self.config;
        let mut h = crc32fast::Hasher::new();
        h.update(serde_json::to_string(c).unwrap_or_default().as_bytes());
        let mut row = vec![0f32; c.hidden_size];
        let step = (c.vocab_size / 64).max(1);
        for r in (0..c.vocab_size).step_by(step).take(64) {
            self.weights.token_embedding.row_into(r, &mut row);
            row.iter().for_each(|x| h.update(&x.to_bits().to_le_bytes()));
        }
        format!("{:?}-{}L-{}d-{}v-{:08x}", c.architecture, c.n_layers, c.hidden_size, c.vocab_size, h.finalize())
            .to_lowercase()
    }

    /// The KVzap predictor `prefill=kvzap[:FILE]` scores with: `file`, or
    /// (`None`) `<fingerprint>.kvzap` from the places
    /// [`find_kvzap`] searches. Read and checked against this model's
    /// fingerprint and shape once, then shared.
    pub fn kvzap_predictor(&self, file: Option<&'static str>) -> Result<std::sync::Arc<KvzapPredictor>> {
        let mut loaded = self.kvzap.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = loaded.iter().find(|(f, _)| *f == file) {
            return Ok(p.clone());
        }
        let fingerprint = self.fingerprint();
        let path = match file {
            Some(f) => std::path::PathBuf::from(f),
            None => find_kvzap(&fingerprint)?,
        };
        let p = KvzapPredictor::load(&path)?;
        let c = &self.config;
        p.check(&fingerprint, c.n_layers, c.n_kv_heads, c.hidden_size, &path)?;
        let p = std::sync::Arc::new(p);
        loaded.push((file, p.clone()));
        Ok(p)
    }

    /// The cache dimensions of this model.
    pub fn cache_shape(&self) -> CacheShape {
        let c = &self.config;
        CacheShape {
            layers: c.n_layers,
            heads: c.n_heads,
            kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            sliding_window: c.features.sliding_window.as_ref().map(|w| (w.window, w.local_layers.clone())),
            model: Some(self.auto_key()),
            kvzap: self.has_kvzap(),
        }
    }

    /// The key `auto:budget=B` looks this model up by
    /// ([`kvslim_cache::policy::auto::model_key`]).
    pub fn auto_key(&self) -> String {
        let c = &self.config;
        kvslim_cache::policy::auto::model_key(&format!("{:?}", c.architecture), c.n_layers, c.hidden_size)
    }

    /// The spec a compressed context of `len` tokens runs when asked for
    /// `spec`: `auto` resolved from the context rows
    /// ([`kvslim_cache::PolicySpec::for_context`]), with this model's
    /// KVzap predictor when one is found and fits; any other spec as it is.
    pub fn context_policy(&self, spec: &kvslim_cache::PolicySpec, len: usize) -> kvslim_cache::PolicySpec {
        if spec.auto.is_none() {
            return spec.clone();
        }
        spec.for_context(Some(&self.auto_key()), len, self.has_kvzap())
    }

    /// Whether this model's own KVzap predictor (`prefill=kvzap`, no file)
    /// is found and fits it (looked up on the first call).
    pub fn has_kvzap(&self) -> bool {
        *self.own_kvzap.get_or_init(|| self.kvzap_predictor(None).is_ok())
    }

    /// Whether every weight matrix multiplies in integers
    /// ([`kvslim_kernels::Products::Int8`]): a product over many rows then
    /// equals each row's alone bit for bit, so a row's result does not
    /// depend on the rows beside it.
    pub fn integer_products(&self) -> bool {
        self.weights.matrices().iter().all(|m| m.products() == kvslim_kernels::Products::Int8)
    }

    /// Whether a cache whose one-chunk prefill kernel is `member` can share
    /// the prefill of a lead whose kernel is `lead`
    /// ([`Model::forward_shared`]): the same kernel, or a tiled member in a
    /// KVzip lead's run where [`Model::integer_products`] holds (its
    /// prompt rows are then the same beside the probe's rows; it attends
    /// over the prompt rows only).
    pub fn shares_prefill(&self, lead: PrefillKernel, member: PrefillKernel) -> bool {
        lead == member
            || (matches!(lead, PrefillKernel::Repeat { .. })
                && member == PrefillKernel::Tiled
                && self.integer_products())
    }
}
