//! GGUF loader tests on tiny files written here: metadata of every value
//! type, a SentencePiece (`llama`) vocabulary, a byte-level BPE (`gpt2`)
//! vocabulary, every supported tensor type against an in-memory model, and
//! corrupt files that must give an error naming the problem (never a panic).

use kvslim_cache::PolicySpec;
use kvslim_kernels::ops::Activation;
use kvslim_kernels::quant::{dequantize, quantize};
use kvslim_kernels::rope::RopeLayout;
use kvslim_kernels::{DType, Matrix};
use kvslim_models::config::{Architecture, ModelConfig, NormKind, RopeConfig, SourceFormat};
use kvslim_models::loader::gguf::{GgufFile, Value};
use kvslim_models::tokenizer::TokenizerKind;
use kvslim_models::weights::{LayerWeights, Linear, NormWeights, Weights};
use kvslim_models::{load_model, Error, LoadedModel, Logits, Model, Scratch};
use std::collections::HashMap;
use std::path::PathBuf;

// ---------------------------------------------------------------- writer

/// A metadata value to write.
#[derive(Clone)]
enum V {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Arr(u32, Vec<V>),
}

impl V {
    fn tag(&self) -> u32 {
        match self {
            V::U8(_) => 0,
            V::I8(_) => 1,
            V::U16(_) => 2,
            V::I16(_) => 3,
            V::U32(_) => 4,
            V::I32(_) => 5,
            V::F32(_) => 6,
            V::Bool(_) => 7,
            V::Str(_) => 8,
            V::Arr(..) => 9,
            V::U64(_) => 10,
            V::I64(_) => 11,
            V::F64(_) => 12,
        }
    }
    fn s(x: &str) -> V {
        V::Str(x.to_string())
    }
    fn strs<S: AsRef<str>>(xs: &[S]) -> V {
        V::Arr(8, xs.iter().map(|x| V::s(x.as_ref())).collect())
    }
    fn f32s(xs: &[f32]) -> V {
        V::Arr(6, xs.iter().map(|&x| V::F32(x)).collect())
    }
    fn i32s(xs: &[i32]) -> V {
        V::Arr(5, xs.iter().map(|&x| V::I32(x)).collect())
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &V) {
    match v {
        V::U8(x) => out.push(*x),
        V::I8(x) => out.push(*x as u8),
        V::U16(x) => out.extend(x.to_le_bytes()),
        V::I16(x) => out.extend(x.to_le_bytes()),
        V::U32(x) => out.extend(x.to_le_bytes()),
        V::I32(x) => out.extend(x.to_le_bytes()),
        V::F32(x) => out.extend(x.to_le_bytes()),
        V::Bool(x) => out.push(*x as u8),
        V::Str(x) => put_str(out, x),
        V::U64(x) => out.extend(x.to_le_bytes()),
        V::I64(x) => out.extend(x.to_le_bytes()),
        V::F64(x) => out.extend(x.to_le_bytes()),
        V::Arr(t, items) => {
            out.extend(t.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for i in items {
                put_value(out, i);
            }
        }
    }
}

struct Tensor {
    name: String,
    /// GGUF order (ne[0] = columns).
    dims: Vec<u64>,
    type_id: u32,
    data: Vec<u8>,
}

/// Where the writer put things, for corrupting them.
#[derive(Default, Debug)]
struct Layout {
    first_key_len_at: usize,
    infos_at: usize,
    type_at: HashMap<String, usize>,
    offset_at: HashMap<String, usize>,
    data_start: usize,
}

struct Gguf {
    version: u32,
    alignment: usize,
    kvs: Vec<(String, V)>,
    tensors: Vec<Tensor>,
}

impl Gguf {
    fn new() -> Self {
        Gguf { version: 3, alignment: 32, kvs: Vec::new(), tensors: Vec::new() }
    }

    fn kv(&mut self, k: &str, v: V) -> &mut Self {
        self.kvs.retain(|(key, _)| key != k);
        self.kvs.push((k.to_string(), v));
        self
    }

    fn remove(&mut self, k: &str) -> &mut Self {
        self.kvs.retain(|(key, _)| key != k);
        self.tensors.retain(|t| t.name != k);
        self
    }

    fn tensor(&mut self, name: &str, dims: &[usize], dt: DType, f32_data: &[f32]) -> &mut Self {
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

    fn tensor_raw(&mut self, name: &str, dims: &[usize], type_id: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.retain(|t| t.name != name);
        self.tensors.push(Tensor {
            name: name.to_string(),
            dims: dims.iter().map(|&d| d as u64).collect(),
            type_id,
            data,
        });
        self
    }

    fn bytes(&self) -> (Vec<u8>, Layout) {
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
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str, bytes: &[u8]) -> Self {
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

fn load_bytes(tag: &str, bytes: &[u8]) -> Result<LoadedModel, Error> {
    let f = TempFile::new(tag, bytes);
    load_model(&f.0)
}

// ---------------------------------------------------------------- model

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = HIDDEN / HEADS;
const FFN: usize = 96;
const LAYERS: usize = 2;
const CONTEXT: usize = 64;

/// Deterministic uniform values in [-scale, scale).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// SentencePiece-style vocabulary: `<unk>`, `<s>`, `</s>`, 256 byte tokens,
/// then pieces with scores.
fn sp_vocab() -> (Vec<String>, Vec<f32>, Vec<i32>) {
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
struct Raw {
    vocab: usize,
    embd: Vec<f32>,
    output: Option<Vec<f32>>,
    final_norm: Vec<f32>,
    layers: Vec<[Vec<f32>; 9]>,
}

/// Per layer: attn_norm, q, k, v, o, ffn_norm, gate, up, down with
/// (rows, cols) of each matrix.
const LAYER_NAMES: [&str; 9] =
    ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"];
fn layer_shape(i: usize) -> (usize, usize) {
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

fn raw_model(vocab: usize, tied: bool, seed: u64) -> Raw {
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

fn base_meta(g: &mut Gguf) {
    g.kv("general.architecture", V::s("llama"))
        .kv("general.name", V::s("tiny test model"))
        .kv("llama.block_count", V::U32(LAYERS as u32))
        .kv("llama.context_length", V::U32(CONTEXT as u32))
        .kv("llama.embedding_length", V::U32(HIDDEN as u32))
        .kv("llama.feed_forward_length", V::U32(FFN as u32))
        .kv("llama.attention.head_count", V::U32(HEADS as u32))
        .kv("llama.attention.head_count_kv", V::U32(KV_HEADS as u32))
        .kv("llama.rope.freq_base", V::F32(10000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", V::F32(1e-5))
        .kv("llama.rope.dimension_count", V::U32(HEAD_DIM as u32));
}

fn sp_tokenizer_meta(g: &mut Gguf) {
    let (tokens, scores, types) = sp_vocab();
    g.kv("tokenizer.ggml.model", V::s("llama"))
        .kv("tokenizer.ggml.tokens", V::strs(&tokens))
        .kv("tokenizer.ggml.scores", V::f32s(&scores))
        .kv("tokenizer.ggml.token_type", V::i32s(&types))
        .kv("tokenizer.ggml.bos_token_id", V::U32(1))
        .kv("tokenizer.ggml.eos_token_id", V::U32(2))
        .kv("tokenizer.ggml.unknown_token_id", V::U32(0));
}

/// Matrices in `dt`, norms f32.
fn add_tensors(g: &mut Gguf, raw: &Raw, dt: DType) {
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

fn tiny_file(dt: DType, tied: bool) -> Gguf {
    let mut g = Gguf::new();
    base_meta(&mut g);
    sp_tokenizer_meta(&mut g);
    let raw = raw_model(sp_vocab().0.len(), tied, 7);
    add_tensors(&mut g, &raw, dt);
    g
}

fn expected_config(vocab: usize, tied: bool) -> ModelConfig {
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
fn memory_model(raw: &Raw, dt: Option<DType>) -> Model {
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

fn logits(m: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut cache = m.new_cache(&PolicySpec::full(), tokens.len(), tokens.len()).unwrap();
    let mut s = Scratch::new();
    m.forward(tokens, &mut cache, &mut s, Logits::All).unwrap();
    s.logits().to_vec()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

fn err_of(r: Result<LoadedModel, Error>) -> Error {
    match r {
        Ok(_) => panic!("expected an error, the file loaded"),
        Err(e) => e,
    }
}

// ---------------------------------------------------------------- tests

#[test]
fn metadata_of_every_value_type_parses() {
    let mut g = tiny_file(DType::F32, true);
    g.kv("t.u8", V::U8(200))
        .kv("t.i8", V::I8(-100))
        .kv("t.u16", V::U16(60000))
        .kv("t.i16", V::I16(-30000))
        .kv("t.u32", V::U32(4_000_000_000))
        .kv("t.i32", V::I32(-2_000_000_000))
        .kv("t.f32", V::F32(1.5))
        .kv("t.bool", V::Bool(true))
        .kv("t.str", V::s("héllo"))
        .kv("t.u64", V::U64(u64::MAX))
        .kv("t.i64", V::I64(i64::MIN))
        .kv("t.f64", V::F64(-2.25))
        .kv("t.empty", V::Arr(4, vec![]))
        .kv("t.nested", V::Arr(9, vec![V::Arr(0, vec![V::U8(1), V::U8(2)]), V::Arr(8, vec![V::s("x")])]))
        .kv("general.alignment", V::U32(64));
    g.alignment = 64;
    let (bytes, _) = g.bytes();
    let f = TempFile::new("meta", &bytes);
    let file = GgufFile::open(&f.0).unwrap();
    assert_eq!(file.version, 3);
    assert_eq!(file.alignment, 64);
    assert!(file.data_start.is_multiple_of(64));
    let md = &file.metadata;
    let get = |k: &str| md.get(k).unwrap().clone();
    assert_eq!(get("t.u8"), Value::U8(200));
    assert_eq!(get("t.i8"), Value::I8(-100));
    assert_eq!(get("t.u16"), Value::U16(60000));
    assert_eq!(get("t.i16"), Value::I16(-30000));
    assert_eq!(get("t.u32"), Value::U32(4_000_000_000));
    assert_eq!(get("t.i32"), Value::I32(-2_000_000_000));
    assert_eq!(get("t.f32"), Value::F32(1.5));
    assert_eq!(get("t.bool"), Value::Bool(true));
    assert_eq!(get("t.str"), Value::Str("héllo".into()));
    assert_eq!(get("t.u64"), Value::U64(u64::MAX));
    assert_eq!(get("t.i64"), Value::I64(i64::MIN));
    assert_eq!(get("t.f64"), Value::F64(-2.25));
    assert_eq!(get("t.empty"), Value::Array(vec![]));
    assert_eq!(
        get("t.nested"),
        Value::Array(vec![Value::Array(vec![Value::U8(1), Value::U8(2)]), Value::Array(vec![Value::Str("x".into())])])
    );
    assert_eq!(md.usize("llama.block_count").unwrap(), Some(LAYERS));
    assert!(md.usize("t.i8").is_err(), "negative value as usize");
    assert!(md.str("t.u8").is_err(), "wrong type is an error");
    assert_eq!(md.keys().next(), Some("general.architecture"));
    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dims, vec![HIDDEN, sp_vocab().0.len()]);
    assert_eq!(embd.dtype, DType::F32);
    assert_eq!(file.tensors().len(), 2 + 9 * LAYERS);
    // and the model still loads with 64-byte alignment
    let m = load_model(&f.0).unwrap();
    assert_eq!(m.model.config.n_layers, LAYERS);
}

#[test]
fn sentencepiece_vocab_round_trip_and_bos() {
    let g = tiny_file(DType::F32, true);
    let (bytes, _) = g.bytes();
    let lm = load_bytes("sp", &bytes).unwrap();
    let t = lm.tokenizer.expect("embedded tokenizer");
    assert!(matches!(t.kind, TokenizerKind::Scored(_)));
    assert!(t.add_bos, "llama vocabularies add BOS by default");
    let (tokens, _, _) = sp_vocab();
    let id = |p: &str| tokens.iter().position(|t| t == p).unwrap() as u32;
    assert_eq!(t.encode("hello world").unwrap(), vec![1, id("▁hello"), id("▁world")]);
    assert_eq!(t.decode(&t.encode("hello world").unwrap()).unwrap(), "hello world");
    // byte fallback for characters outside the vocabulary
    for s in ["hello cat, wörld!", "a  b\nc", "東京"] {
        let ids = t.encode(s).unwrap();
        assert_eq!(ids[0], 1);
        assert_eq!(t.decode(&ids).unwrap(), s, "round trip of {s:?} via {ids:?}");
    }
    assert_eq!(t.eos, vec![2]);
    assert_eq!(t.vocab_size(), tokens.len());

    for (flag, want_bos) in [(true, true), (false, false)] {
        let mut g = tiny_file(DType::F32, true);
        g.kv("tokenizer.ggml.add_bos_token", V::Bool(flag));
        let t = load_bytes("bos", &g.bytes().0).unwrap().tokenizer.unwrap();
        let ids = t.encode("hello").unwrap();
        assert_eq!(ids[0] == 1, want_bos, "add_bos_token={flag}: {ids:?}");
        assert_eq!(ids.last(), Some(&id("▁hello")));
    }
    // add_space_prefix = false: no dummy leading space
    let mut g = tiny_file(DType::F32, true);
    g.kv("tokenizer.ggml.add_space_prefix", V::Bool(false));
    let t = load_bytes("prefix", &g.bytes().0).unwrap().tokenizer.unwrap();
    let ids = t.encode("hello").unwrap();
    assert!(!ids.contains(&id("▁hello")), "{ids:?}");
    assert_eq!(t.decode(&ids).unwrap(), "hello");
}

#[test]
fn byte_level_bpe_vocab_with_special_tokens() {
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    // the 256 byte-level characters, then merges
    let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    alphabet.sort();
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_start|>".into()];
    tokens.extend(alphabet.iter().map(|c| c.to_string()));
    let merges = ["Ġ t", "h e", "Ġt he", "c a", "ca t", "Ġ cat"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    let mut types = vec![1; tokens.len()];
    types[0] = 3;
    types[1] = 3;
    let vocab = tokens.len();
    let id = |p: &str| tokens.iter().position(|t| t == p).unwrap() as u32;
    for pre in ["gpt2", "smollm", "llama-bpe", "qwen2"] {
        let mut g = Gguf::new();
        base_meta(&mut g);
        g.kv("tokenizer.ggml.model", V::s("gpt2"))
            .kv("tokenizer.ggml.pre", V::s(pre))
            .kv("tokenizer.ggml.tokens", V::strs(&tokens))
            .kv("tokenizer.ggml.token_type", V::i32s(&types))
            .kv("tokenizer.ggml.merges", V::strs(&merges))
            .kv("tokenizer.ggml.bos_token_id", V::U32(1))
            .kv("tokenizer.ggml.eos_token_id", V::U32(0));
        add_tensors(&mut g, &raw_model(vocab, true, 3), DType::F32);
        let t = load_bytes("bpe", &g.bytes().0).unwrap().tokenizer.unwrap();
        assert!(matches!(t.kind, TokenizerKind::Hf(_)));
        assert!(!t.add_bos, "gpt2 vocabularies add no BOS by default");
        let ids = t.encode("<|im_start|>the cat").unwrap();
        assert_eq!(ids, vec![1, id("t"), id("he"), id("Ġcat")], "pre {pre}");
        assert_eq!(t.decode(&ids).unwrap(), "the cat", "special tokens skipped");
        let s = "Tea at 12:05 — café";
        assert_eq!(t.decode(&t.encode(s).unwrap()).unwrap(), s, "pre {pre}");
    }
    // an unknown pre-tokenizer is named in the error
    let mut g = Gguf::new();
    base_meta(&mut g);
    g.kv("tokenizer.ggml.model", V::s("gpt2"))
        .kv("tokenizer.ggml.pre", V::s("deepseek-llm"))
        .kv("tokenizer.ggml.tokens", V::strs(&tokens))
        .kv("tokenizer.ggml.merges", V::strs(&merges));
    add_tensors(&mut g, &raw_model(vocab, true, 3), DType::F32);
    let e = err_of(load_bytes("pre", &g.bytes().0)).to_string();
    assert!(e.contains("deepseek-llm") && e.contains("not supported"), "{e}");
}

#[test]
fn every_tensor_type_matches_the_in_memory_model() {
    let vocab = sp_vocab().0.len();
    let tokens = [1u32, 280, 5, 270, 42, 283, 7, 2];
    for tied in [true, false] {
        let raw = raw_model(vocab, tied, 11);
        let exact = logits(&memory_model(&raw, None), &tokens);
        let scale = exact.iter().fold(0f32, |a, b| a.max(b.abs()));
        for (dt, tol) in [
            (DType::F32, 1e-6),
            // relative to max |logit|; measured on this random model:
            // f16 5e-4, bf16 5e-3, q8_0 1.1e-2, q4_0 0.16, q4_1 0.20
            (DType::F16, 2e-3),
            (DType::BF16, 0.02),
            (DType::Q8_0, 0.04),
            (DType::Q4_0, 0.35),
            (DType::Q4_1, 0.35),
        ] {
            let mut g = Gguf::new();
            base_meta(&mut g);
            sp_tokenizer_meta(&mut g);
            add_tensors(&mut g, &raw, dt);
            let lm = load_bytes("dtype", &g.bytes().0).unwrap();
            let m = &lm.model;
            let c = &m.config;
            let want = expected_config(vocab, tied);
            assert_eq!(
                format!("{:?}", serde_json::to_value(c).unwrap()),
                format!("{:?}", serde_json::to_value(&want).unwrap())
            );
            assert_eq!(m.weights.token_embedding.dtype(), dt);
            assert_eq!(m.weights.layers[1].down.weight.dtype(), dt);
            assert_eq!(m.weights.lm_head.is_none(), tied);
            let got = logits(m, &tokens);
            // the same stored bytes in memory: identical up to rounding
            let same = max_abs(&got, &logits(&memory_model(&raw, Some(dt)), &tokens));
            // against exact f32 weights: quantization error only
            let drift = max_abs(&got, &exact);
            eprintln!("{dt} tied={tied}: |Δ| vs in-memory {same:.1e}, vs f32 {drift:.3} (max |logit| {scale:.1})");
            assert!(same <= 1e-5, "{dt}: loaded vs in-memory {same}");
            assert!(drift <= tol * scale, "{dt}: drift {drift} > {tol} × {scale}");
        }
    }
    // norms stored as f16 are widened to f32
    let raw = raw_model(vocab, true, 11);
    let mut g = Gguf::new();
    base_meta(&mut g);
    add_tensors(&mut g, &raw, DType::F32);
    g.tensor("output_norm.weight", &[HIDDEN], DType::F16, &raw.final_norm);
    let lm = load_bytes("f16norm", &g.bytes().0).unwrap();
    let mut want = vec![0f32; HIDDEN];
    dequantize(DType::F16, &quantize(DType::F16, &raw.final_norm), &mut want);
    assert_eq!(lm.model.weights.final_norm.weight, want);
    assert!(lm.tokenizer.is_none(), "no tokenizer.ggml.model: no tokenizer");
}

#[test]
fn version_2_loads_version_1_is_refused() {
    let mut g = tiny_file(DType::Q8_0, true);
    g.version = 2;
    let lm = load_bytes("v2", &g.bytes().0).unwrap();
    assert_eq!(lm.model.config.n_layers, LAYERS);
    g.version = 1;
    let e = err_of(load_bytes("v1", &g.bytes().0)).to_string();
    assert!(e.contains("version 1"), "{e}");
    g.version = 7;
    let e = err_of(load_bytes("v7", &g.bytes().0)).to_string();
    assert!(e.contains("version 7"), "{e}");
}

#[test]
fn truncated_files_are_errors() {
    let (bytes, lay) = tiny_file(DType::Q4_0, false).bytes();
    let mut cuts = vec![
        4,
        6,
        12,
        20,
        lay.first_key_len_at + 3,
        lay.first_key_len_at + 12,
        lay.infos_at / 2,
        lay.infos_at - 1,
        lay.infos_at + 5,
        (lay.infos_at + lay.data_start) / 2,
        lay.data_start,
        lay.data_start + 100,
        (lay.data_start + bytes.len()) / 2,
        bytes.len() - 1,
    ];
    // and a sweep through the header
    cuts.extend((4..lay.data_start).step_by(97));
    for cut in cuts {
        let e = err_of(load_bytes("cut", &bytes[..cut]));
        let msg = e.to_string();
        assert!(msg.contains("truncated"), "cut at {cut}: {msg}");
    }
    // shorter than the magic: not a GGUF file at all
    assert!(load_bytes("tiny", &bytes[..3]).is_err());
    assert!(load_bytes("empty", &[]).is_err());
}

#[test]
fn lying_headers_are_errors() {
    let (bytes, lay) = tiny_file(DType::F32, true).bytes();
    let patched = |at: usize, v: &[u8]| {
        let mut b = bytes.clone();
        b[at..at + v.len()].copy_from_slice(v);
        b
    };
    let msg = |b: &[u8]| err_of(load_bytes("lie", b)).to_string();

    // absurd counts are refused before any allocation
    let e = msg(&patched(8, &1_000_000_000_000u64.to_le_bytes()));
    assert!(e.contains("tensor count") && e.contains("1000000000000"), "{e}");
    let e = msg(&patched(16, &1_000_000_000_000u64.to_le_bytes()));
    assert!(e.contains("metadata count") && e.contains("1000000000000"), "{e}");
    let e = msg(&patched(8, &u64::MAX.to_le_bytes()));
    assert!(e.contains("tensor count"), "{e}");
    // small lies: one tensor or entry more than listed
    let n_tensors = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    assert!(load_bytes("lie", &patched(8, &(n_tensors + 1).to_le_bytes())).is_err());
    assert!(load_bytes("lie", &patched(8, &(n_tensors - 1).to_le_bytes())).is_err());
    let n_kv = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
    assert!(load_bytes("lie", &patched(16, &(n_kv + 1).to_le_bytes())).is_err());

    // a string length that lies
    let e = msg(&patched(lay.first_key_len_at, &(1u64 << 40).to_le_bytes()));
    assert!(e.contains("string length"), "{e}");
    let e = msg(&patched(lay.first_key_len_at, &u64::MAX.to_le_bytes()));
    assert!(e.contains("string length"), "{e}");
    assert!(load_bytes("lie", &patched(lay.first_key_len_at, &25u64.to_le_bytes())).is_err());
    // the token list: find the count of `tokenizer.ggml.tokens`
    let key = b"tokenizer.ggml.tokens";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4 + 4;
    let e = msg(&patched(at, &(1u64 << 50).to_le_bytes()));
    assert!(e.contains("tokenizer.ggml.tokens") && e.contains("claims"), "{e}");

    // tensor data offset past the end of the file
    let name = "blk.1.ffn_down.weight";
    let far = (bytes.len() as u64).div_ceil(32) * 32;
    let e = msg(&patched(lay.offset_at[name], &far.to_le_bytes()));
    assert!(e.contains(name) && e.contains("past the end"), "{e}");
    let e = msg(&patched(lay.offset_at[name], &(u64::MAX - 31).to_le_bytes()));
    assert!(e.contains(name) && e.contains("past the end"), "{e}");
    let e = msg(&patched(lay.offset_at[name], &33u64.to_le_bytes()));
    assert!(e.contains("alignment"), "{e}");

    // unknown and unsupported tensor types
    let e = err_of(load_bytes("ty", &patched(lay.type_at[name], &99u32.to_le_bytes())));
    assert!(matches!(e, Error::UnsupportedTensorType { .. }), "{e:?}");
    let e = e.to_string();
    assert!(e.contains(name) && e.contains("unknown GGML type id 99"), "{e}");
    let e = msg(&patched(lay.type_at[name], &16u32.to_le_bytes()));
    assert!(e.contains("iq2_xxs") && e.contains("supported: ") && e.contains("q4_k"), "{e}");

    // bad alignment
    let mut g = tiny_file(DType::F32, true);
    g.kv("general.alignment", V::U32(48));
    g.alignment = 48;
    let e = msg(&g.bytes().0);
    assert!(e.contains("alignment"), "{e}");

    // bad magic
    let e = msg(&patched(0, b"GGUX"));
    assert!(e.contains("magic"), "{e}");
}

#[test]
fn model_level_problems_are_named() {
    // unknown architecture
    let mut g = tiny_file(DType::F32, true);
    g.kv("general.architecture", V::s("mamba"));
    let e = err_of(load_bytes("arch", &g.bytes().0));
    assert!(matches!(e, Error::UnknownArchitecture(_)), "{e:?}");
    assert!(e.to_string().contains("mamba"), "{e}");

    // shape mismatch: attn_q with the wrong number of rows
    let mut g = tiny_file(DType::F32, true);
    g.tensor("blk.0.attn_q.weight", &[HIDDEN, 32], DType::F32, &vec![0.1; HIDDEN * 32]);
    let e = err_of(load_bytes("shape", &g.bytes().0));
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e:?}");
    assert!(e.to_string().contains("blk.0.attn_q.weight"), "{e}");
    // transposed
    let mut g = tiny_file(DType::F32, true);
    g.tensor("blk.1.ffn_up.weight", &[FFN, HIDDEN], DType::F32, &vec![0.1; HIDDEN * FFN]);
    let e = err_of(load_bytes("shape", &g.bytes().0)).to_string();
    assert!(e.contains("blk.1.ffn_up.weight"), "{e}");

    // missing tensor
    let mut g = tiny_file(DType::F32, true);
    g.remove("blk.1.ffn_gate.weight");
    let e = err_of(load_bytes("missing", &g.bytes().0));
    assert!(matches!(e, Error::MissingTensor(_)), "{e:?}");
    assert!(e.to_string().contains("blk.1.ffn_gate.weight"), "{e}");

    // what a tiny F32 file edited by `edit` loads with: an error naming `needle`
    let refused = |edit: &dyn Fn(&mut Gguf) -> &mut Gguf, needle: &str| {
        let mut g = tiny_file(DType::F32, true);
        edit(&mut g);
        let e = err_of(load_bytes("edited", &g.bytes().0)).to_string();
        assert!(e.contains(needle), "{e}");
    };
    // missing and mistyped metadata
    refused(&|g| g.remove("llama.block_count"), "llama.block_count");
    refused(&|g| g.kv("llama.embedding_length", V::s("sixty-four")), "llama.embedding_length");
    let mut g = tiny_file(DType::F32, true);
    g.kv("llama.attention.head_count_kv", V::U32(3));
    assert!(load_bytes("meta", &g.bytes().0).is_err());
    // quantized rows must hold whole blocks
    refused(&|g| g.tensor_raw("blk.0.attn_norm.weight", &[40], 8, vec![0; 34]), "multiple of the q8_0 block size");
    // an unsupported tokenizer model is named
    refused(&|g| g.kv("tokenizer.ggml.model", V::s("bert")), "bert");
    // scores of the wrong length
    refused(&|g| g.kv("tokenizer.ggml.scores", V::f32s(&[0.0; 3])), "tokenizer.ggml.scores");
    // a BOS id outside the vocabulary
    refused(&|g| g.kv("tokenizer.ggml.bos_token_id", V::U32(100_000)), "bos_token_id");
}

#[test]
fn random_corruption_never_panics() {
    let (bytes, lay) = tiny_file(DType::Q4_1, false).bytes();
    let mut r = Rng(12345);
    let mut errors = 0;
    for i in 0..300 {
        let mut b = bytes.clone();
        // corrupt 1-4 bytes of the header (the data section cannot fail)
        for _ in 0..1 + i % 4 {
            let at = ((r.next() + 1.0) * 0.5 * lay.data_start as f32) as usize % lay.data_start;
            b[at] = (r.next() * 128.0 + 128.0) as u8;
        }
        if load_bytes("fuzz", &b).is_err() {
            errors += 1;
        }
    }
    eprintln!("{errors} of 300 corrupted headers were refused, the rest still loaded");
}
