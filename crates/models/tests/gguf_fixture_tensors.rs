//! Per-tensor checks of the llama.cpp-made GGUF fixtures
//! (`../shared/fixtures/gguf`, see its README): every tensor's type, shape
//! and byte size as the reference JSON lists them, and its dequantization
//! (`kvslim_kernels::quant::dequantize`) against the checksums gguf-py's
//! reference dequantizer produced (first/last 8 values, Σ, Σ|·|, Σ²). This
//! pins the exact GGML formulas of every block format the files use (Q8_0,
//! Q4_0, Q5_0 and the K-quants Q2_K…Q6_K) without running a model. A
//! second test checks every kernel set's fused dequantize-dot on every row
//! of the K-quant and Q5_0 files against dequantize-then-dot.
//!
//! A missing fixture fails the test (it is not skipped).

mod common;

use kvslim_kernels::dot::{available, dot_row};
use kvslim_kernels::quant::dequantize;
use kvslim_kernels::DType;
use kvslim_models::loader::gguf::{GgufFile, TensorInfo};
use serde_json::Value;
use std::path::PathBuf;

/// The files the fixture README promises: llama has every type, the other
/// architectures all but the pure Q6_K and Q5_0 files.
fn expected_files() -> Vec<(&'static str, &'static str)> {
    let all = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K", "Q5_0", "Q4_0"];
    let most = ["Q8_0", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K", "Q4_0"];
    let mut v: Vec<_> = all.iter().map(|t| ("llama", *t)).collect();
    for arch in ["qwen2", "qwen3", "gemma3", "phi3"] {
        v.extend(most.iter().map(|t| (arch, *t)));
    }
    v
}

fn fixture_dir() -> PathBuf {
    common::shared().join("fixtures/gguf")
}

fn open(arch: &str, ty: &str) -> (GgufFile, Value) {
    let dir = fixture_dir().join(arch);
    let gguf = dir.join(format!("{ty}.gguf"));
    let json = dir.join(format!("{ty}.reference.json"));
    assert!(gguf.exists(), "missing fixture {}", gguf.display());
    assert!(json.exists(), "missing fixture {}", json.display());
    let f = GgufFile::open(&gguf).unwrap_or_else(|e| panic!("{}: {e}", gguf.display()));
    let text = std::fs::read_to_string(&json).unwrap_or_else(|e| panic!("{}: {e}", json.display()));
    let r: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", json.display()));
    (f, r)
}

fn f64s(v: &Value, what: &str) -> Vec<f64> {
    v.as_array().unwrap_or_else(|| panic!("{what} is not an array")).iter().map(|x| x.as_f64().expect(what)).collect()
}

fn dequantized(f: &GgufFile, t: &TensorInfo) -> Vec<f32> {
    let mut out = vec![f32::NAN; t.numel()];
    dequantize(t.dtype, f.data(t), &mut out);
    out
}

/// `got` is the reference value (an f32 written as a JSON number) to within
/// 1e-7, or the same bits.
fn close(got: f32, want: f64) -> bool {
    got.to_bits() == (want as f32).to_bits() || (got as f64 - want).abs() <= 1e-7
}

#[test]
fn every_fixture_file_is_present() {
    let expected = expected_files();
    assert_eq!(expected.len(), 32);
    let mut found = Vec::new();
    for arch in ["llama", "qwen2", "qwen3", "gemma3", "phi3"] {
        let dir = fixture_dir().join(arch);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for e in entries {
            let name = e.expect("dir entry").file_name().to_string_lossy().into_owned();
            if let Some(ty) = name.strip_suffix(".gguf") {
                found.push(format!("{arch}/{ty}"));
            }
        }
    }
    for (arch, ty) in &expected {
        let key = format!("{arch}/{ty}");
        assert!(found.contains(&key), "fixture {key}.gguf is missing from {}", fixture_dir().display());
        assert!(fixture_dir().join(format!("{key}.reference.json")).exists(), "{key}.reference.json is missing");
    }
    assert_eq!(found.len(), expected.len(), "unexpected fixture files: {found:?}");
}

/// Type, shape, size and dequantized checksums of every tensor in every file.
#[test]
fn every_tensor_dequantizes_to_the_reference() {
    let mut checked = std::collections::BTreeMap::<String, usize>::new();
    for (arch, ty) in expected_files() {
        let (f, r) = open(arch, ty);
        let tensors = r["tensors"].as_object().unwrap_or_else(|| panic!("{arch}/{ty}: no `tensors`"));
        assert_eq!(tensors.len(), f.tensors().len(), "{arch}/{ty}: tensor count");
        for (name, want) in tensors {
            let ctx = format!("{arch}/{ty} {name}");
            let t = f.tensor(name).unwrap_or_else(|| panic!("{ctx}: not in the file"));
            let want_type = want["type"].as_str().expect("type");
            assert_eq!(DType::parse(want_type), Some(t.dtype), "{ctx}: type {want_type} vs {}", t.dtype);
            let ne: Vec<usize> =
                want["ne"].as_array().expect("ne").iter().map(|v| v.as_u64().expect("ne") as usize).collect();
            assert_eq!(t.dims, ne, "{ctx}: shape");
            assert_eq!(t.nbytes as u64, want["n_bytes"].as_u64().expect("n_bytes"), "{ctx}: bytes");
            assert_eq!(t.nbytes, t.dtype.bytes_for(t.numel()), "{ctx}: bytes for the type");

            let y = dequantized(&f, t);
            let (first, last) = (f64s(&want["first"], "first"), f64s(&want["last"], "last"));
            assert_eq!((first.len(), last.len()), (8, 8), "{ctx}: first/last");
            for (i, w) in first.iter().enumerate() {
                assert!(close(y[i], *w), "{ctx}: element {i} = {} vs {w}", y[i]);
            }
            let n = y.len();
            for (i, w) in last.iter().enumerate() {
                let k = n - 8 + i;
                assert!(close(y[k], *w), "{ctx}: element {k} = {} vs {w}", y[k]);
            }
            let (mut s, mut sa, mut sq) = (0f64, 0f64, 0f64);
            for &v in &y {
                let v = v as f64;
                s += v;
                sa += v.abs();
                sq += v * v;
            }
            let (ws, wsa, wsq) = (
                want["sum"].as_f64().expect("sum"),
                want["sum_abs"].as_f64().expect("sum_abs"),
                want["sum_sq"].as_f64().expect("sum_sq"),
            );
            assert!((s - ws).abs() <= 1e-6 * wsa, "{ctx}: sum {s} vs {ws}");
            assert!((sa - wsa).abs() <= 1e-6 * wsa, "{ctx}: sum_abs {sa} vs {wsa}");
            assert!((sq - wsq).abs() <= 1e-6 * wsq, "{ctx}: sum_sq {sq} vs {wsq}");
            *checked.entry(t.dtype.to_string()).or_default() += 1;
        }
    }
    // every block format the files hold was exercised
    for dt in ["f32", "q8_0", "q4_0", "q5_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"] {
        assert!(checked.get(dt).copied().unwrap_or(0) > 0, "no {dt} tensor checked: {checked:?}");
    }
}

/// Every kernel set's fused dot agrees with dequantize-then-dot (in f64)
/// on every row of every 2-D tensor of llama's Q2_K, Q3_K_M (Q3_K, Q4_K,
/// Q5_K, Q6_K) and Q5_0 files, within 1e-5 of Σ|w·x|.
#[test]
fn fused_dots_match_dequantized_rows() {
    let mut seen = std::collections::HashSet::new();
    for ty in ["Q2_K", "Q3_K_M", "Q5_0"] {
        let (f, _) = open("llama", ty);
        for t in f.tensors().iter().filter(|t| t.dims.len() == 2) {
            let cols = t.dims[0];
            let rows = t.dims[1];
            let rb = t.dtype.bytes_for(cols);
            let w = dequantized(&f, t);
            // activations of both signs and varying size
            let x: Vec<f32> = (0..cols).map(|i| ((i * 7919 % 263) as f32 - 131.0) / 50.0).collect();
            let data = f.data(t);
            for k in available() {
                for r in 0..rows {
                    let row = &data[r * rb..(r + 1) * rb];
                    let (want, mag) =
                        w[r * cols..(r + 1) * cols].iter().zip(&x).fold((0f64, 0f64), |(s, a), (p, q)| {
                            let v = *p as f64 * *q as f64;
                            (s + v, a + v.abs())
                        });
                    let got = dot_row(&k, t.dtype, row, &x) as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * mag + 1e-30,
                        "llama/{ty} {} row {r} ({}, {}): {got} vs {want}",
                        t.name,
                        t.dtype,
                        k.isa
                    );
                }
            }
            seen.insert(t.dtype);
        }
    }
    for dt in [DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q5_0] {
        assert!(seen.contains(&dt), "no {dt} tensor dotted");
    }
}
