//! Helpers shared by the model integration tests: locating `../shared`.
#![allow(dead_code)]

use std::path::PathBuf;

#[path = "../../../../testing/shared_dir.rs"]
mod shared_dir;

pub mod gguf;
pub mod llamacpp;

/// `../shared` (or `KVSLIM_SHARED`), which must exist.
pub fn shared() -> PathBuf {
    let p = shared_dir::shared();
    assert!(p.exists(), "../shared not found beside the repository ({}); set KVSLIM_SHARED", p.display());
    p
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// Standard base64 (with `=` padding) to bytes; the fixtures store logits
/// this way. Panics on a malformed string (fixtures are trusted input).
pub fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("invalid base64 byte {c}"),
        }
    };
    let bytes: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for chunk in bytes.chunks(4) {
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        let mut acc = 0u32;
        for &c in chunk {
            acc = (acc << 6) | if c == b'=' { 0 } else { value(c) };
        }
        let three = [(acc >> 16) as u8, (acc >> 8) as u8, acc as u8];
        out.extend_from_slice(&three[..3 - pad]);
    }
    out
}

/// Little-endian f32s from bytes.
pub fn f32s_le(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Writes f32 tensors as one safetensors file (test checkpoints).
pub fn write_safetensors_f32(path: &std::path::Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape, data) in tensors {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "{name}");
        let end = offset + data.len() * 4;
        header.insert(name.clone(), serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, end]}));
        offset = end;
    }
    let mut text = serde_json::Value::Object(header).to_string();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    for (_, _, data) in tensors {
        data.iter().for_each(|v| bytes.extend_from_slice(&v.to_le_bytes()));
    }
    std::fs::write(path, bytes).unwrap();
}
