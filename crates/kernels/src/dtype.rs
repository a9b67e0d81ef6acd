//! Weight storage types and their GGML block layouts.

use std::fmt;

/// How a weight tensor is stored. Quantized types are GGML block formats:
/// 32 elements per block for the `Qn_m` types, 256-element super-blocks for
/// the K-quants (`Qn_K`), byte-compatible with llama.cpp's GGUF files.
// GGML's names (Q4_K, …) are kept so the variants read as llama.cpp's types.
#[allow(non_camel_case_types)]
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
    /// 32 × 5-bit (low nibbles plus a 32-bit mask of fifth bits) with one
    /// f16 scale: x = d·(q − 16). 22 bytes.
    Q5_0,
    /// 32 × 5-bit with f16 scale and minimum: x = d·q + m. 24 bytes.
    Q5_1,
    /// 256 × 2-bit in 16 groups of 16, each with a 4-bit scale and a 4-bit
    /// minimum, under f16 super-scales: x = d·s·q − dmin·m. 84 bytes.
    Q2_K,
    /// 256 × 3-bit (2 low bits plus a high-bit mask) in 16 groups of 16 with
    /// 6-bit signed scales (offset 32): x = d·(s − 32)·(q − 4). 110 bytes.
    Q3_K,
    /// 256 × 4-bit in 8 groups of 32 with 6-bit scales and minimums:
    /// x = d·s·q − dmin·m. 144 bytes.
    Q4_K,
    /// 256 × 5-bit in 8 groups of 32 with 6-bit scales and minimums:
    /// x = d·s·q − dmin·m. 176 bytes.
    Q5_K,
    /// 256 × 6-bit in 16 groups of 16 with i8 scales: x = d·s·(q − 32).
    /// 210 bytes.
    Q6_K,
}

impl DType {
    /// Every storage type, plain floats first.
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];

    /// Elements per block (1 for plain floating types).
    pub fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => 32,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K => 256,
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
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
        }
    }

    /// Whether this is a 256-element super-block (K-quant) format.
    pub fn is_k_quant(self) -> bool {
        self.block_elems() == 256
    }

    /// Bytes needed for `n` elements (n must be a multiple of the block size).
    pub fn bytes_for(self, n: usize) -> usize {
        n / self.block_elems() * self.block_bytes()
    }

    /// Parses a user-facing name such as `f16`, `q8_0` or `q4_k`.
    pub fn parse(s: &str) -> Option<DType> {
        let s = s.to_ascii_lowercase();
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// The lower-case name (as GGML spells it), used by [`DType::parse`]
    /// and `Display`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q2_K => "q2_k",
            DType::Q3_K => "q3_k",
            DType::Q4_K => "q4_k",
            DType::Q5_K => "q5_k",
            DType::Q6_K => "q6_k",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_match_ggml() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()), Some(d));
            assert_eq!(DType::parse(&d.to_string().to_uppercase()), Some(d));
        }
        assert_eq!(DType::parse("q4_K"), Some(DType::Q4_K));
        assert_eq!(DType::parse("iq2_xxs"), None);
        // sizeof(block_*) in ggml-common.h
        let sizes: Vec<(usize, usize)> =
            [DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K]
                .iter()
                .map(|d| (d.block_elems(), d.block_bytes()))
                .collect();
        assert_eq!(sizes, [(32, 22), (32, 24), (256, 84), (256, 110), (256, 144), (256, 176), (256, 210)]);
        assert_eq!(DType::Q6_K.bytes_for(512), 420);
    }
}
