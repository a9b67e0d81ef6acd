//! GGUF loader tests on corrupt tiny files (`common::gguf` writes them):
//! every one must give an error naming the problem, never a panic.

mod common;

use common::gguf::*;
use kvslim_kernels::DType;
use kvslim_models::loader::gguf::Value;
use kvslim_models::Error;

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
    g.kv("general.alignment", Value::U32(48));
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
    g.kv("llama.attention.head_count_kv", Value::U32(3));
    assert!(load_bytes("meta", &g.bytes().0).is_err());
    // quantized rows must hold whole blocks
    refused(&|g| g.tensor_raw("blk.0.attn_norm.weight", &[40], 8, vec![0; 34]), "multiple of the q8_0 block size");
    // an unsupported tokenizer model is named
    refused(&|g| g.kv("tokenizer.ggml.model", V::s("bert")), "bert");
    // scores of the wrong length
    refused(&|g| g.kv("tokenizer.ggml.scores", V::f32s(&[0.0; 3])), "tokenizer.ggml.scores");
    // a BOS id outside the vocabulary
    refused(&|g| g.kv("tokenizer.ggml.bos_token_id", Value::U32(100_000)), "bos_token_id");
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
