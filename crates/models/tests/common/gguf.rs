//! A GGUF writer and a tiny llama model for the synthetic GGUF tests
//! (`gguf_synthetic.rs`, `gguf_synthetic_errors.rs`): files of every
//! metadata and tensor type written here, and the same model in memory.

use kvslim_cache::PolicySpec;
use kvslim_kernels::ops::Activation;
use kvslim_kernels::quant::quantize;
use kvslim_kernels::rope::RopeLayout;
use kvslim_kernels::{DType, Matrix};
use kvslim_models::config::{Architecture, ModelConfig, NormKind, RopeConfig, SourceFormat};
use kvslim_models::loader::gguf::Value;
use kvslim_models::weights::{LayerWeights, Linear, NormWeights, Weights};
use kvslim_models::{load_model, Error, LoadedModel, Logits, Model, Scratch};
use std::collections::HashMap;
use std::path::PathBuf;

// ---------------------------------------------------------------- writer

/// A metadata value to write: one of the loader's own scalar [`Value`]s,
/// or an array whose element type tag is written as given (an empty array
/// has no element to take it from).
#[derive(Clone)]
pub enum V {
    Scalar(Value),
    Arr(u32, Vec<V>),
}

impl From<Value> for V {
    fn from(v: Value) -> V {
        V::Scalar(v)
    }
}

impl V {
    pub fn tag(&self) -> u32 {
        match self {
            V::Scalar(v) => v.tag(),
            V::Arr(..) => Value::Array(vec![]).tag(),
        }
    }
    pub fn s(x: &str) -> V {
        Value::Str(x.to_string()).into()
    }
    pub fn strs<S: AsRef<str>>(xs: &[S]) -> V {
        V::Arr(8, xs.iter().map(|x| V::s(x.as_ref())).collect())
    }
    pub fn f32s(xs: &[f32]) -> V {
        V::Arr(6, xs.iter().map(|&x| Value::F32(x).into()).collect())
    }
    pub fn i32s(xs: &[i32]) -> V {
        V::Arr(5, xs.iter().map(|&x| Value::I32(x).into()).collect())
    }
}

pub fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

pub fn put_value(out: &mut Vec<u8>, v: &V) {
    let x = match v {
        V::Scalar(x) => x,
        V::Arr(t, items) => {
            out.extend(t.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for i in items {
                put_value(out, i);
            }
            return;
        }
    };
    match x {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::Str(x) => put_str(out, x),
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
        Value::Array(_) => panic!("arrays are written as V::Arr (with their element type)"),
    }
}

pub struct Tensor {
    pub name: String,
    /// GGUF order (ne[0] = columns).
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

/// Where the writer put things, for corrupting them.
#[derive(Default, Debug)]
pub struct Layout {
    pub first_key_len_at: usize,
    pub infos_at: usize,
    pub type_at: HashMap<String, usize>,
    pub offset_at: HashMap<String, usize>,
    pub data_start: usize,
}

pub struct Gguf {
    pub version: u32,
    pub alignment: usize,
    pub kvs: Vec<(String, V)>,
    pub tensors: Vec<Tensor>,
}

impl Gguf {
    pub fn new() -> Self {
        Gguf { version: 3, alignment: 32, kvs: Vec::new(), tensors: Vec::new() }
    }

    pub fn kv(&mut self, k: &str, v: impl Into<V>) -> &mut Self {
        self.kvs.retain(|(key, _)| key != k);
        self.kvs.push((k.to_string(), v.into()));
        self
    }

    pub fn remove(&mut self, k: &str) -> &mut Self {
        self.kvs.retain(|(key, _)| key != k);
        self.tensors.retain(|t| t.name != k);
        self
    }

    pub fn tensor(&mut self, name: &str, dims: &[usize], dt: DType, f32_data: &[f32]) -> &mut Self {
        let type_id = match dt {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q8_0 => 8,
            DType::BF16 => 30,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q2_K => 10,
            DType::Q3_K => 11,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
        };
        self.tensor_raw(name, dims, type_id, quantize(dt, f32_data))
    }

    pub fn tensor_raw(&mut self, name: &str, dims: &[usize], type_id: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.retain(|t| t.name != name);
        self.tensors.push(Tensor {
            name: name.to_string(),
            dims: dims.iter().map(|&d| d as u64).collect(),
            type_id,
            data,
        });
        self
    }

    pub fn bytes(&self) -> (Vec<u8>, Layout) {
        let mut lay = Layout::default();
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        lay.first_key_len_at = out.len();
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            out.extend(v.tag().to_le_bytes());
            put_value(&mut out, v);
        }
        lay.infos_at = out.len();
        let align = |x: usize| x.div_ceil(self.alignment) * self.alignment;
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            lay.type_at.insert(t.name.clone(), out.len());
            out.extend(t.type_id.to_le_bytes());
            lay.offset_at.insert(t.name.clone(), out.len());
            out.extend((offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = align(offset + t.data.len());
        }
        lay.data_start = align(out.len());
        out.resize(lay.data_start, 0);
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize(lay.data_start + off, 0);
            out.extend(&t.data);
        }
        (out, lay)
    }
}

/// A file in the temp dir, removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(tag: &str, bytes: &[u8]) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "kvslim-gguf-{}-{}-{tag}.gguf",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&p, bytes).unwrap();
        TempFile(p)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub fn load_bytes(tag: &str, bytes: &[u8]) -> Result<LoadedModel, Error> {
    let f = TempFile::new(tag, bytes);
    load_model(&f.0)
}

// ---------------------------------------------------------------- model

pub const HIDDEN: usize = 64;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const HEAD_DIM: usize = HIDDEN / HEADS;
pub const FFN: usize = 96;
pub const LAYERS: usize = 2;
pub const CONTEXT: usize = 64;

/// Deterministic uniform values in [-scale, scale).
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// SentencePiece-style vocabulary: `<unk>`, `<s>`, `</s>`, 256 byte tokens,
/// then pieces with scores.
pub fn sp_vocab() -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let pieces = [
        "▁", "h", "e", "l", "o", "w", "r", "d", "a", "c", "t", "ll", "▁h", "▁w", "or", "ld", "he", "llo", "▁he",
        "▁hello", "▁wor", "▁world", "▁c", "at", "▁cat",
    ];
    let mut scores = vec![0.0; tokens.len()];
    for (i, p) in pieces.iter().enumerate() {
        tokens.push(p.to_string());
        types.push(1);
        // longer pieces merge first
        scores.push(-(i as f32) + 10.0 * p.chars().count() as f32);
    }
    (tokens, scores, types)
}

/// Row-major f32 weights of the tiny model.
pub struct Raw {
    pub vocab: usize,
    pub embd: Vec<f32>,
    pub output: Option<Vec<f32>>,
    pub final_norm: Vec<f32>,
    pub layers: Vec<[Vec<f32>; 9]>,
}

/// Per layer: attn_norm, q, k, v, o, ffn_norm, gate, up, down with
/// (rows, cols) of each matrix.
pub const LAYER_NAMES: [&str; 9] =
    ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"];
pub fn layer_shape(i: usize) -> (usize, usize) {
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    [
        (1, HIDDEN),
        (q, HIDDEN),
        (kv, HIDDEN),
        (kv, HIDDEN),
        (HIDDEN, q),
        (1, HIDDEN),
        (FFN, HIDDEN),
        (FFN, HIDDEN),
        (HIDDEN, FFN),
    ][i]
}

pub fn raw_model(vocab: usize, tied: bool, seed: u64) -> Raw {
    let mut r = Rng(seed);
    let layers = (0..LAYERS)
        .map(|_| {
            std::array::from_fn(|i| {
                let (rows, cols) = layer_shape(i);
                if rows == 1 {
                    r.vec(cols, 0.2).iter().map(|v| 1.0 + v).collect()
                } else {
                    r.vec(rows * cols, 1.7 / (cols as f32).sqrt())
                }
            })
        })
        .collect();
    Raw {
        vocab,
        embd: r.vec(vocab * HIDDEN, 1.0),
        output: (!tied).then(|| r.vec(vocab * HIDDEN, 3.0 / (HIDDEN as f32).sqrt())),
        final_norm: r.vec(HIDDEN, 0.2).iter().map(|v| 1.0 + v).collect(),
        layers,
    }
}

pub fn base_meta(g: &mut Gguf) {
    g.kv("general.architecture", V::s("llama"))
        .kv("general.name", V::s("tiny test model"))
        .kv("llama.block_count", Value::U32(LAYERS as u32))
        .kv("llama.context_length", Value::U32(CONTEXT as u32))
        .kv("llama.embedding_length", Value::U32(HIDDEN as u32))
        .kv("llama.feed_forward_length", Value::U32(FFN as u32))
        .kv("llama.attention.head_count", Value::U32(HEADS as u32))
        .kv("llama.attention.head_count_kv", Value::U32(KV_HEADS as u32))
        .kv("llama.rope.freq_base", Value::F32(10000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .kv("llama.rope.dimension_count", Value::U32(HEAD_DIM as u32));
}

pub fn sp_tokenizer_meta(g: &mut Gguf) {
    let (tokens, scores, types) = sp_vocab();
    g.kv("tokenizer.ggml.model", V::s("llama"))
        .kv("tokenizer.ggml.tokens", V::strs(&tokens))
        .kv("tokenizer.ggml.scores", V::f32s(&scores))
        .kv("tokenizer.ggml.token_type", V::i32s(&types))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(2))
        .kv("tokenizer.ggml.unknown_token_id", Value::U32(0));
}

/// Matrices in `dt`, norms f32.
pub fn add_tensors(g: &mut Gguf, raw: &Raw, dt: DType) {
    g.tensor("token_embd.weight", &[HIDDEN, raw.vocab], dt, &raw.embd);
    for (l, ws) in raw.layers.iter().enumerate() {
        for (i, w) in ws.iter().enumerate() {
            let (rows, cols) = layer_shape(i);
            let name = format!("blk.{l}.{}.weight", LAYER_NAMES[i]);
            if rows == 1 {
                g.tensor(&name, &[cols], DType::F32, w);
            } else {
                g.tensor(&name, &[cols, rows], dt, w);
            }
        }
    }
    g.tensor("output_norm.weight", &[HIDDEN], DType::F32, &raw.final_norm);
    if let Some(o) = &raw.output {
        g.tensor("output.weight", &[HIDDEN, raw.vocab], dt, o);
    }
}

pub fn tiny_file(dt: DType, tied: bool) -> Gguf {
    let mut g = Gguf::new();
    base_meta(&mut g);
    sp_tokenizer_meta(&mut g);
    let raw = raw_model(sp_vocab().0.len(), tied, 7);
    add_tensors(&mut g, &raw, dt);
    g
}

pub fn expected_config(vocab: usize, tied: bool) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        format: SourceFormat::Gguf,
        n_layers: LAYERS,
        n_heads: HEADS,
        n_kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        hidden_size: HIDDEN,
        ffn_size: FFN,
        vocab_size: vocab,
        context_len: CONTEXT,
        norm: NormKind::Rms,
        norm_eps: 1e-5,
        activation: Activation::Silu,
        gated_mlp: true,
        rope: Some(RopeConfig { theta: 10000.0, rotary_dim: HEAD_DIM, layout: RopeLayout::AdjacentPairs }),
        learned_positions: None,
        parallel_residual: false,
        tied_embeddings: tied,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        features: Default::default(),
    }
}

/// The same model built in memory, matrices stored as `dt` (`None`: the
/// exact f32 weights).
pub fn memory_model(raw: &Raw, dt: Option<DType>) -> Model {
    let m = |rows: usize, cols: usize, w: &[f32]| match dt {
        None => Matrix::from_f32(rows, cols, w).unwrap(),
        Some(dt) => Matrix::quantized(dt, rows, cols, w).unwrap(),
    };
    let norm = |w: &[f32]| NormWeights { weight: w.to_vec(), bias: None };
    let layers = raw
        .layers
        .iter()
        .map(|ws| {
            let lin = |i: usize| {
                let (rows, cols) = layer_shape(i);
                Linear::new(m(rows, cols, &ws[i]), None)
            };
            LayerWeights::pre_norm(
                norm(&ws[0]),
                [lin(1), lin(2), lin(3)],
                lin(4),
                norm(&ws[5]),
                Some(lin(6)),
                [lin(7), lin(8)],
            )
        })
        .collect();
    let weights = Weights {
        token_embedding: m(raw.vocab, HIDDEN, &raw.embd),
        position_embedding: None,
        layers,
        final_norm: norm(&raw.final_norm),
        lm_head: raw.output.as_ref().map(|o| Linear::new(m(raw.vocab, HIDDEN, o), None)),
    };
    Model::new(expected_config(raw.vocab, raw.output.is_none()), weights).unwrap()
}

pub fn logits(m: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut cache = m.new_cache(&PolicySpec::full(), tokens.len(), tokens.len()).unwrap();
    let mut s = Scratch::new();
    m.forward(tokens, &mut cache, &mut s, Logits::All).unwrap();
    s.logits().to_vec()
}

pub fn err_of(r: Result<LoadedModel, Error>) -> Error {
    match r {
        Ok(_) => panic!("expected an error, the file loaded"),
        Err(e) => e,
    }
}
