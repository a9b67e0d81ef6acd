//! Weight storage types and their GGML block layouts.

use std::fmt;

/// How a weight tensor is stored. Quantized types are GGML block formats
/// with 32 elements per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// 32 × i8 with one f16 scale: x = d·q.
    Q8_0,
    /// 32 × 4-bit with one f16 scale: x = d·(q − 8).
    Q4_0,
    /// 32 × 4-bit with f16 scale and minimum: x = d·q + m.
    Q4_1,
}

impl DType {
    /// Elements per block (1 for plain floating types).
    pub fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
        }
    }

    /// Bytes needed for `n` elements (n must be a multiple of the block size).
    pub fn bytes_for(self, n: usize) -> usize {
        n / self.block_elems() * self.block_bytes()
    }

    /// Parses a user-facing name such as `f16` or `q8_0`.
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "q8_0" => DType::Q8_0,
            "q4_0" => DType::Q4_0,
            "q4_1" => DType::Q4_1,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
        })
    }
}
