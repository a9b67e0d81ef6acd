//! Malformed model files give a clear error, never a panic: truncated and
//! lying safetensors and llama2.c files, bad `config.json`s, wrong shapes,
//! missing tensors, wrong file types. Each bad file is built in a temporary
//! folder from the real fixtures in `../shared`.
//!
//! (GGUF-specific corruption is tested with the GGUF loader.)

mod common;

use common::shared;
use kvslim_models::load_model;
use kvslim_models::loader::load_tokenizer;
use serde_json::{json, Map, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

// ---------------------------------------------------------------- helpers

/// A fresh folder under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(case: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let slug: String = case.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        let dir = std::env::temp_dir().join(format!(
            "kvslim-corrupt-{}-{}-{slug}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).expect("write scratch file");
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The message of the error `f` returns; fails the test if it succeeds or
/// panics.
fn error_of<T>(case: &str, f: impl FnOnce() -> kvslim_models::Result<T>) -> String {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(_)) => panic!("{case}: loaded successfully although the input is corrupt"),
        Ok(Err(e)) => e.to_string(),
        Err(p) => panic!("{case}: panicked instead of returning an error: {}", kvslim_fuzz::panic_message(p.as_ref())),
    }
}

/// `load_model(path)` fails with a message containing every one of `needles`.
fn expect_load_error(case: &str, path: &Path, needles: &[&str]) {
    let msg = error_of(case, || load_model(path));
    for n in needles {
        assert!(msg.contains(n), "{case}: expected the error to mention {n:?}, got: {msg}");
    }
}

fn parity(name: &str) -> PathBuf {
    shared().join("fixtures/parity").join(name)
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A safetensors file split into its JSON header and data.
struct St {
    header: Map<String, Value>,
    data: Vec<u8>,
}

impl St {
    fn read(path: &Path) -> Self {
        let b = read(path);
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        let header = serde_json::from_slice::<Value>(&b[8..8 + n]).unwrap().as_object().unwrap().clone();
        St { header, data: b[8 + n..].to_vec() }
    }

    fn llama() -> Self {
        Self::read(&parity("llama-gqa").join("model.safetensors"))
    }

    fn bytes(&self) -> Vec<u8> {
        with_header(&serde_json::to_vec(&self.header).unwrap(), &self.data)
    }

    /// Drops a tensor's entry and its bytes (later offsets move down), so
    /// the file stays a valid safetensors file without it.
    fn remove(&mut self, name: &str) {
        let offs = |v: &Value| {
            let o = v["data_offsets"].as_array().unwrap();
            (o[0].as_u64().unwrap() as usize, o[1].as_u64().unwrap() as usize)
        };
        let (s, e) = offs(&self.header.remove(name).unwrap_or_else(|| panic!("fixture has no tensor {name}")));
        self.data.drain(s..e);
        for (k, v) in self.header.iter_mut().filter(|(k, _)| *k != "__metadata__") {
            let (a, b) = offs(v);
            if a >= e {
                v["data_offsets"] = json!([a - (e - s), b - (e - s)]);
            } else {
                assert!(b <= s, "{k} overlaps {name}");
            }
        }
    }

    fn tensor(&mut self, name: &str) -> &mut Map<String, Value> {
        self.header
            .get_mut(name)
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("fixture has no tensor {name}"))
    }
}

/// Header length, header bytes, data.
fn with_header(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// A Hugging Face folder: the llama-gqa config (or `config`) and the given
/// `model.safetensors` bytes.
fn hf_dir(case: &str, model: &[u8], config: Option<&Value>) -> Scratch {
    let s = Scratch::new(case);
    match config {
        Some(c) => s.write("config.json", &serde_json::to_vec_pretty(c).unwrap()),
        None => s.write("config.json", &read(&parity("llama-gqa").join("config.json"))),
    };
    s.write("model.safetensors", model);
    s
}

fn llama_config() -> Value {
    serde_json::from_slice(&read(&parity("llama-gqa").join("config.json"))).unwrap()
}

const K_PROJ: &str = "model.layers.0.self_attn.k_proj.weight";
const NORM: &str = "model.layers.0.input_layernorm.weight";

fn stories() -> PathBuf {
    shared().join("models/stories260K")
}

/// A llama2.c checkpoint `stories260K.bin` holding `bytes`.
fn llama2c_file(case: &str, bytes: &[u8]) -> (Scratch, PathBuf) {
    let s = Scratch::new(case);
    let p = s.write("stories260K.bin", bytes);
    (s, p)
}

/// The stories260K checkpoint with header field `i` replaced.
fn with_llama2c_field(fields: &[(usize, i32)]) -> Vec<u8> {
    let mut b = read(&stories().join("stories260K.bin"));
    for &(i, v) in fields {
        b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// Deterministic pseudo-random bytes.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

// ---------------------------------------------------------------- sanity

#[test]
fn untouched_copies_load() {
    // the helpers themselves produce loadable files
    let s = hf_dir("pristine", &St::llama().bytes(), None);
    load_model(&s.0).expect("rebuilt llama-gqa loads");
    let (_s, p) = llama2c_file("pristine-bin", &read(&stories().join("stories260K.bin")));
    load_model(&p).expect("copied stories260K loads");
}

// ---------------------------------------------------------------- safetensors

#[test]
fn safetensors_truncated() {
    let good = St::llama().bytes();
    let hlen = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let cases: [(&str, usize, &str); 8] = [
        ("empty file", 0, "shorter than the 8-byte header length"),
        ("inside the length", 5, "shorter than the 8-byte header length"),
        ("length only", 8, "header claims"),
        ("inside the header", 8 + hlen / 2, "header claims"),
        ("one byte short of the header", 8 + hlen - 1, "header claims"),
        ("header only", 8 + hlen, "(truncated?)"),
        ("inside the data", 8 + hlen + (good.len() - 8 - hlen) / 2, "(truncated?)"),
        ("last byte missing", good.len() - 1, "(truncated?)"),
    ];
    for (name, cut, needle) in cases {
        let case = format!("safetensors truncated: {name} ({cut} bytes)");
        let s = hf_dir(&case, &good[..cut], None);
        expect_load_error(&case, &s.0, &["invalid safetensors", needle]);
        // the file itself, named directly, reaches the same reader
        expect_load_error(&case, &s.0.join("model.safetensors"), &[needle]);
    }
}

#[test]
fn safetensors_header_length_beyond_file() {
    let good = St::llama().bytes();
    for (name, len) in [("one past the end", (good.len() - 8 + 1) as u64), ("u64::MAX", u64::MAX), ("2^63", 1u64 << 63)]
    {
        let mut b = good.clone();
        b[..8].copy_from_slice(&len.to_le_bytes());
        let case = format!("header length {name}");
        let s = hf_dir(&case, &b, None);
        expect_load_error(&case, &s.0, &["header claims", "bytes but the file has"]);
    }
}

#[test]
fn safetensors_offsets_beyond_file() {
    let st = St::llama();
    let dlen = st.data.len() as u64;
    let size = 64 * 4; // the norm weight: [64] f32
    for (name, start) in [
        ("just past the end", dlen - size + 4),
        ("far past the end", dlen * 1000),
        ("wrapping around u64", u64::MAX - size),
        ("wrapping around usize arithmetic", u64::MAX - size - 4),
    ] {
        let mut st = St::llama();
        st.tensor(NORM).insert("data_offsets".into(), json!([start, start + size]));
        let case = format!("data_offsets {name}");
        let s = hf_dir(&case, &st.bytes(), None);
        expect_load_error(&case, &s.0, &[NORM, "but the file has"]);
    }
}

#[test]
fn safetensors_offsets_disagree_with_shape() {
    for (name, offs) in [
        ("too short", json!([0, 100])),
        ("too long", json!([0, 64 * 4 + 4])),
        ("reversed", json!([256, 0])),
        ("empty", json!([0, 0])),
    ] {
        let mut st = St::llama();
        st.tensor(NORM).insert("data_offsets".into(), offs);
        let case = format!("data_offsets {name}");
        let s = hf_dir(&case, &st.bytes(), None);
        expect_load_error(&case, &s.0, &[NORM, "does not match its size"]);
    }
    // a shape whose byte size overflows
    let mut st = St::llama();
    st.tensor(NORM).insert("shape".into(), json!([1u64 << 40, 1u64 << 40]));
    let s = hf_dir("overflowing shape", &st.bytes(), None);
    expect_load_error("overflowing shape", &s.0, &[NORM, "does not match its size"]);
}

#[test]
fn safetensors_malformed_tensor_entries() {
    let cases: [(&str, Value, &str); 6] = [
        ("no shape", json!({"dtype": "F32", "data_offsets": [0, 256]}), "has no valid shape"),
        ("negative dim", json!({"dtype": "F32", "shape": [-64], "data_offsets": [0, 256]}), "has no valid shape"),
        ("no offsets", json!({"dtype": "F32", "shape": [64]}), "has no valid data_offsets"),
        (
            "three offsets",
            json!({"dtype": "F32", "shape": [64], "data_offsets": [0, 128, 256]}),
            "has no valid data_offsets",
        ),
        ("no dtype", json!({"shape": [64], "data_offsets": [0, 256]}), "dtype"),
        ("not an object", json!("F32"), "is not a JSON object"),
    ];
    for (name, entry, needle) in cases {
        let mut st = St::llama();
        st.header.insert(NORM.into(), entry);
        let case = format!("tensor entry: {name}");
        let s = hf_dir(&case, &st.bytes(), None);
        expect_load_error(&case, &s.0, &[NORM, needle]);
    }
}

#[test]
fn safetensors_unknown_dtype() {
    for dt in ["F8_E4M3", "I8", "U8", "BOOL", "f32", ""] {
        let mut st = St::llama();
        st.tensor(K_PROJ).insert("dtype".into(), json!(dt));
        let case = format!("dtype {dt:?}");
        let s = hf_dir(&case, &st.bytes(), None);
        expect_load_error(&case, &s.0, &[K_PROJ, &format!("has unsupported type {dt}")]);
    }
}

#[test]
fn safetensors_integer_weight() {
    // a known dtype of the right size, but not one a weight can have
    let mut st = St::llama();
    st.tensor(K_PROJ).insert("dtype".into(), json!("I32"));
    let s = hf_dir("I32 weight", &st.bytes(), None);
    expect_load_error("I32 weight", &s.0, &[K_PROJ, "unsupported type I32"]);
}

#[test]
fn safetensors_spans_with_gaps_or_overlaps() {
    // an entry dropped from the header, its bytes left in the file
    let mut st = St::llama();
    st.header.remove(K_PROJ);
    let s = hf_dir("gap", &st.bytes(), None);
    expect_load_error("gap", &s.0, &["invalid safetensors", "invalid offset for tensor", "model.safetensors"]);
    // two tensors over the same bytes
    let mut st = St::llama();
    let other = st.tensor(K_PROJ)["data_offsets"].clone();
    let shape = st.tensor(K_PROJ)["shape"].clone();
    st.header.insert("extra.weight".into(), json!({"dtype": "F32", "shape": shape, "data_offsets": other}));
    let s = hf_dir("overlap", &st.bytes(), None);
    expect_load_error("overlap", &s.0, &["invalid safetensors", "invalid offset for tensor"]);
}

#[test]
fn safetensors_header_not_json() {
    let data = St::llama().data;
    for (name, header, needle) in [
        ("text", &b"this is not JSON at all"[..], "header is not JSON"),
        ("cut JSON", &br#"{"a": {"dtype": "F32", "sha"#[..], "header is not JSON"),
        ("binary", &[0xff, 0xfe, 0x00, 0x7b][..], "header is not JSON"),
        ("empty", &b""[..], "header is not JSON"),
        ("an array", &b"[1, 2, 3]"[..], "header is not a JSON object"),
    ] {
        let case = format!("header {name}");
        let s = hf_dir(&case, &with_header(header, &data), None);
        expect_load_error(&case, &s.0, &["invalid safetensors", needle]);
    }
}

#[test]
fn hf_unknown_architecture() {
    let mut cfg = llama_config();
    cfg["architectures"] = json!(["FooForCausalLM"]);
    let s = hf_dir("unknown arch", &St::llama().bytes(), Some(&cfg));
    expect_load_error("unknown arch", &s.0, &["unknown architecture `FooForCausalLM`", "LlamaForCausalLM"]);
    // neither `architectures` nor `model_type`
    let mut cfg = llama_config();
    let obj = cfg.as_object_mut().unwrap();
    obj.remove("architectures");
    obj.remove("model_type");
    let s = hf_dir("no arch", &St::llama().bytes(), Some(&cfg));
    expect_load_error("no arch", &s.0, &["config.json", "neither `architectures` nor `model_type`"]);
}

#[test]
fn hf_config_missing_required_field() {
    for field in [
        "hidden_size",
        "num_attention_heads",
        "num_hidden_layers",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    ] {
        let mut cfg = llama_config();
        cfg.as_object_mut().unwrap().remove(field);
        let case = format!("config without {field}");
        let s = hf_dir(&case, &St::llama().bytes(), Some(&cfg));
        expect_load_error(&case, &s.0, &["config.json", &format!("lacks `{field}`")]);
    }
    // present but not a number
    let mut cfg = llama_config();
    cfg["hidden_size"] = json!("64");
    let s = hf_dir("string hidden_size", &St::llama().bytes(), Some(&cfg));
    expect_load_error("string hidden_size", &s.0, &["lacks `hidden_size`"]);
}

#[test]
fn hf_config_implausible_sizes() {
    // sizes that would overflow the loader's arithmetic or ask for absurd
    // buffers are refused while reading config.json
    let cases: [(&str, &str, Value, &str); 6] = [
        ("llama-gqa", "head_dim", json!(1u64 << 62), "implausible head_dim"),
        ("llama-gqa", "intermediate_size", json!(u64::MAX), "implausible ffn_size"),
        ("llama-gqa", "num_key_value_heads", json!(0), "n_kv_heads must be positive"),
        ("llama-gqa", "num_hidden_layers", json!(1u64 << 40), "implausible model dimensions"),
        ("gpt2", "n_embd", json!(u64::MAX), "implausible model dimensions"),
        ("opt", "max_position_embeddings", json!(u64::MAX), "implausible context_len"),
    ];
    for (fixture, field, value, needle) in cases {
        let dir = parity(fixture);
        let mut cfg: Value = serde_json::from_slice(&read(&dir.join("config.json"))).unwrap();
        cfg[field] = value.clone();
        let case = format!("{fixture} with {field} = {value}");
        let s = hf_dir(&case, &read(&dir.join("model.safetensors")), Some(&cfg));
        expect_load_error(&case, &s.0, &["config.json", needle]);
    }
}

#[test]
fn hf_config_not_json_or_absent() {
    let s = Scratch::new("bad config");
    s.write("config.json", b"{ \"architectures\": [");
    s.write("model.safetensors", &St::llama().bytes());
    expect_load_error("config not JSON", &s.0, &["config.json", "invalid JSON"]);

    let s = Scratch::new("no config");
    s.write("model.safetensors", &St::llama().bytes());
    expect_load_error("no config.json", &s.0, &["cannot read", "config.json"]);

    let s = Scratch::new("empty dir");
    expect_load_error("empty directory", &s.0, &["cannot read", "config.json"]);
}

#[test]
fn hf_no_weights() {
    let s = Scratch::new("no weights");
    s.write("config.json", &read(&parity("llama-gqa").join("config.json")));
    expect_load_error("no weights", &s.0, &["no model.safetensors or model.safetensors.index.json"]);
}

#[test]
fn hf_sharded_index_problems() {
    let cases: [(&str, &[u8], &[&str]); 4] = [
        (
            "missing shard",
            br#"{"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}"#,
            &["cannot read", "model-00001-of-00002.safetensors"],
        ),
        (
            "shard outside the folder",
            br#"{"weight_map": {"lm_head.weight": "../model.safetensors"}}"#,
            &["is not a plain file name"],
        ),
        ("no weight_map", br#"{"metadata": {}}"#, &["missing `weight_map`"]),
        ("not JSON", b"{", &["model.safetensors.index.json", "invalid JSON"]),
    ];
    for (name, index, needles) in cases {
        let s = Scratch::new(name);
        s.write("config.json", &read(&parity("llama-gqa").join("config.json")));
        s.write("model.safetensors.index.json", index);
        expect_load_error(&format!("index: {name}"), &s.0, needles);
    }
}

#[test]
fn hf_weight_with_wrong_shape() {
    // [16, 64] stored as [64, 16]: the byte size still agrees
    let mut st = St::llama();
    st.tensor(K_PROJ).insert("shape".into(), json!([64, 16]));
    let s = hf_dir("swapped k_proj", &st.bytes(), None);
    expect_load_error("swapped k_proj shape", &s.0, &[K_PROJ, "expected shape [16, 64], found [64, 16]"]);
    // a norm with a vector shape of the wrong rank
    let mut st = St::llama();
    st.tensor(NORM).insert("shape".into(), json!([8, 8]));
    let s = hf_dir("2-D norm", &st.bytes(), None);
    expect_load_error("2-D norm", &s.0, &[NORM, "expected shape [64], found [8, 8]"]);
}

#[test]
fn hf_missing_tensor() {
    for name in [
        "model.layers.2.self_attn.v_proj.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight", // the fixture's head is untied
    ] {
        let mut st = St::llama();
        st.remove(name);
        let case = format!("without {name}");
        let s = hf_dir(&case, &st.bytes(), None);
        expect_load_error(&case, &s.0, &[&format!("tensor `{name}` is missing")]);
    }
}

#[test]
fn hf_missing_tensor_other_architectures() {
    for (fixture, name) in [
        ("gpt2", "h.1.attn.c_attn.weight"),
        ("opt", "model.decoder.layers.0.fc2.weight"),
        ("gpt-neox", "gpt_neox.layers.0.attention.query_key_value.weight"),
    ] {
        let dir = parity(fixture);
        let mut st = St::read(&dir.join("model.safetensors"));
        // names may or may not carry the architecture prefix
        let key = st
            .header
            .keys()
            .find(|k| k.ends_with(name))
            .cloned()
            .unwrap_or_else(|| panic!("{fixture} has no tensor ending in {name}"));
        st.remove(&key);
        let cfg: Value = serde_json::from_slice(&read(&dir.join("config.json"))).unwrap();
        let case = format!("{fixture} without {key}");
        let s = hf_dir(&case, &st.bytes(), Some(&cfg));
        expect_load_error(&case, &s.0, &[name, "is missing"]);
    }
}

// ---------------------------------------------------------------- llama2.c

#[test]
fn llama2c_truncated() {
    let good = read(&stories().join("stories260K.bin"));
    let cases: [(&str, usize, &str); 8] = [
        ("empty", 0, "shorter than the 28-byte header"),
        ("inside the header", 11, "shorter than the 28-byte header"),
        ("one byte short of the header", 27, "shorter than the 28-byte header"),
        ("header only", 28, "header describes"),
        ("inside the embedding", 28 + 1000, "header describes"),
        ("half", good.len() / 2, "header describes"),
        ("last float missing", good.len() - 4, "header describes"),
        ("last byte missing", good.len() - 1, "header describes"),
    ];
    for (name, cut, needle) in cases {
        let case = format!("llama2.c truncated: {name} ({cut} bytes)");
        let (_s, p) = llama2c_file(&case, &good[..cut]);
        expect_load_error(&case, &p, &["not a llama2.c checkpoint", needle]);
    }
}

/// Case name, header fields to overwrite, expected message.
type HeaderCase = (&'static str, Vec<(usize, i32)>, &'static str);

#[test]
fn llama2c_header_lies_about_sizes() {
    // fields: 0 dim, 1 hidden_dim, 2 n_layers, 3 n_heads, 4 n_kv_heads, 5 vocab, 6 seq_len
    let cases: [HeaderCase; 9] = [
        ("n_layers 4000", vec![(2, 4000)], "header describes"),
        ("n_layers i32::MAX", vec![(2, i32::MAX)], "implausible"),
        ("dim 2^28", vec![(0, 1 << 28)], "implausible"),
        ("dim 1024", vec![(0, 1024)], "header describes"),
        ("hidden i32::MAX", vec![(1, i32::MAX)], "header describes"),
        ("vocab 2^20", vec![(5, 1 << 20)], "header describes"),
        ("seq_len i32::MAX", vec![(6, i32::MAX)], "header describes"),
        (
            "everything huge (overflows 64-bit size arithmetic)",
            vec![(0, 1 << 20), (1, i32::MAX), (2, 4096), (3, 8), (4, 4), (6, i32::MAX)],
            "header describes",
        ),
        ("unshared classifier that is not there", vec![(5, -512)], "header describes"),
    ];
    for (name, fields, needle) in cases {
        let case = format!("llama2.c header: {name}");
        let (_s, p) = llama2c_file(&case, &with_llama2c_field(&fields));
        expect_load_error(&case, &p, &["not a llama2.c checkpoint", needle]);
    }
}

#[test]
fn llama2c_non_positive_sizes() {
    let names = ["dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab", "seq_len"];
    for (i, field) in names.iter().enumerate() {
        for v in [0, -1, i32::MIN] {
            if i == 5 && v == -1 {
                continue; // negative vocab = unshared classifier (tested above)
            }
            let case = format!("llama2.c {field} = {v}");
            let (_s, p) = llama2c_file(&case, &with_llama2c_field(&[(i, v)]));
            let msg = error_of(&case, || load_model(&p));
            assert!(
                msg.contains("not a llama2.c checkpoint")
                    && (msg.contains("non-positive")
                        || msg.contains("implausible")
                        || msg.contains("header describes")),
                "{case}: unclear error: {msg}"
            );
        }
    }
}

#[test]
fn llama2c_inconsistent_heads() {
    let (_s, p) = llama2c_file("heads", &with_llama2c_field(&[(3, 7)]));
    expect_load_error("dim % n_heads", &p, &["not divisible by n_heads 7"]);
    let (_s, p) = llama2c_file("kv heads", &with_llama2c_field(&[(4, 3)]));
    expect_load_error("n_heads % n_kv_heads", &p, &["not a multiple of n_kv_heads (3)"]);
}

#[test]
fn llama2c_tokenizer_truncated() {
    let good = read(&stories().join("tok512.bin"));
    // entry 0 is `<unk>`: score, length 5, 5 bytes
    let cases: [(&str, usize, &str); 6] = [
        ("empty", 0, "shorter than its 4-byte header"),
        ("inside the header", 2, "shorter than its 4-byte header"),
        ("header only", 4, "fewer than 3 tokens"),
        ("inside an entry header", 4 + 6, "truncated entry header"),
        ("inside a piece", 4 + 8 + 2, "claims 5 bytes past the end"),
        ("last byte missing", good.len() - 1, "past the end"),
    ];
    for (name, cut, needle) in cases {
        let case = format!("tok512.bin truncated: {name} ({cut} bytes)");
        let s = Scratch::new(&case);
        let p = s.write("tok512.bin", &good[..cut]);
        let msg = error_of(&case, || load_tokenizer(&p, None, vec![]));
        assert!(
            msg.contains("not a llama2.c tokenizer") && msg.contains(needle),
            "{case}: expected {needle:?}, got: {msg}"
        );
    }
    // a negative piece length
    let mut b = good.clone();
    b[8..12].copy_from_slice(&(-1i32).to_le_bytes());
    let s = Scratch::new("negative piece length");
    let p = s.write("tok512.bin", &b);
    let msg = error_of("negative piece length", || load_tokenizer(&p, None, vec![]));
    assert!(msg.contains("claims -1 bytes"), "negative piece length: {msg}");
}

#[test]
fn llama2c_tokenizer_shorter_than_vocab() {
    // cut at an entry boundary: a valid file, but 300 tokens for a
    // 512-token model; loading the pair must say so
    let good = read(&stories().join("tok512.bin"));
    let mut at = 4;
    for _ in 0..300 {
        let len = i32::from_le_bytes(good[at + 4..at + 8].try_into().unwrap()) as usize;
        at += 8 + len;
    }
    let s = Scratch::new("short tokenizer");
    s.write("tok512.bin", &good[..at]);
    let model = s.write("stories260K.bin", &read(&stories().join("stories260K.bin")));
    expect_load_error("300-token tokenizer", &model, &["300 tokens", "512"]);
}

// ---------------------------------------------------------------- paths and file types

#[test]
fn nonexistent_path() {
    let s = Scratch::new("nonexistent");
    for name in ["model.gguf", "model.bin", "model.safetensors", "some-dir"] {
        let p = s.0.join(name);
        expect_load_error(name, &p, &["cannot read", name, "no such file or directory"]);
    }
}

#[test]
fn random_bytes() {
    let s = Scratch::new("random");
    let bytes = noise(4096, 0x5eed);
    assert_ne!(&bytes[..4], b"GGUF");
    let cases: [(&str, &[u8], &[&str]); 6] = [
        ("random.gguf", &bytes, &["not a GGUF file"]),
        ("empty.gguf", b"", &["not a GGUF file"]),
        ("tiny.gguf", b"GG", &["not a GGUF file"]),
        ("random.bin", &bytes, &["not a llama2.c checkpoint"]),
        ("random.dat", &bytes, &["unrecognised model file"]),
        ("random", &bytes, &["unrecognised model file"]),
    ];
    for (name, content, needles) in cases {
        let p = s.write(name, content);
        expect_load_error(name, &p, needles);
    }
    // several seeds for the llama2.c parser, which trusts nothing in the header
    for seed in 1..40u64 {
        let p = s.write("noise.bin", &noise(2048, seed));
        let case = format!("noise.bin seed {seed}");
        expect_load_error(&case, &p, &["not a llama2.c checkpoint"]);
    }
    // a random .safetensors in a folder without config.json
    let p = s.write("model.safetensors", &bytes);
    expect_load_error("random.safetensors", &p, &["config.json"]);
}
