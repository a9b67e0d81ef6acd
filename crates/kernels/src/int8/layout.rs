//! The panel layout of the repacked weights and the quantized activations:
//! sizes, offsets and where each quant lives. The packing (`super::pack`),
//! the portable micro-kernel and the VNNI one (`crate::simd::avx512`) all
//! read it from here.

use crate::dtype::DType;
use crate::quant::{QK, QK_K};

/// Weight rows per panel: one per 32-bit lane of a 512-bit vector.
pub const PANEL_ROWS: usize = 16;
/// Tokens per micro-tile: 8 integer and 8 f32 accumulators, 16 of the 32
/// vector registers.
pub const TILE_TOKENS: usize = 8;
/// Bytes of a panel block's f16 header: 16 f16 scales, then 16 f16
/// minimums; the quants follow it.
pub(super) const HEADER: usize = 64;
/// Offset of the minimums inside a panel block's f16 header.
pub(crate) const MIN_OFFSET: usize = 32;
/// Bytes of a K-quant block's header: the 16 rows' 6-bit scales at
/// [`K_SCALE_OFFSET`] and minimums at [`K_MIN_OFFSET`], a byte each (Q6_K:
/// the two halves' i8 scales at the same offsets). The super-block's f16
/// `d` (and `dmin`, at [`MIN_OFFSET`]) are in the super-block header.
pub(super) const K_HEADER: usize = 32;
/// Offset of the K-quant scales inside a block header.
pub(crate) const K_SCALE_OFFSET: usize = 0;
/// Offset of the K-quant minimums (Q6_K: second half's scales) inside a
/// block header.
pub(crate) const K_MIN_OFFSET: usize = PANEL_ROWS;
/// Blocks of 32 columns per K-quant super-block.
pub(super) const SUPER: usize = QK_K / QK;
/// Bytes of the nibble quants of a panel block (16 rows × 32 columns).
pub(crate) const NIBBLES: usize = PANEL_ROWS * QK / 2;
/// Bytes of one bit plane (16 rows × 32 columns, one bit each).
pub(crate) const PLANE: usize = PANEL_ROWS * QK / 8;

/// Whether `dtype` has an integer path.
pub fn supports(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::Q4_K | DType::Q5_K | DType::Q6_K
    )
}

pub(super) fn is_k_quant(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_K | DType::Q5_K | DType::Q6_K)
}

/// Bytes of a panel block's header.
pub(crate) fn header_bytes(dtype: DType) -> usize {
    if is_k_quant(dtype) {
        K_HEADER
    } else {
        HEADER
    }
}

/// Bytes of a K-quant super-block header (16 f16 `d`, and for Q4_K/Q5_K
/// 16 f16 `dmin` at [`MIN_OFFSET`]); 0 for the other formats.
pub(super) fn super_header_bytes(dtype: DType) -> usize {
    match dtype {
        DType::Q4_K | DType::Q5_K => HEADER,
        DType::Q6_K => HEADER / 2,
        _ => 0,
    }
}

/// Where block `b` (of 32 columns) of a panel starts, and where the f16
/// `d` (then `m` or `dmin` at [`MIN_OFFSET`]) that scale it are: its own
/// header, or its K-quant super-block's.
#[inline]
pub(crate) fn block_at(dtype: DType, b: usize) -> (usize, usize) {
    let bb = block_bytes(dtype);
    if is_k_quant(dtype) {
        let shb = super_header_bytes(dtype);
        let sup = (b / SUPER) * (shb + SUPER * bb);
        (sup + shb + (b % SUPER) * bb, sup)
    } else {
        (b * bb, b * bb)
    }
}

/// Bit planes above the nibbles (the fifth and sixth bits of the quants;
/// Q6_K holds its two in the same bytes as crumbs, see [`crumb_at`]).
pub(crate) fn planes(dtype: DType) -> usize {
    match dtype {
        DType::Q5_0 | DType::Q5_1 | DType::Q5_K => 1,
        DType::Q6_K => 2,
        _ => 0,
    }
}

/// Bytes of one panel block (16 rows × 32 columns): the header, then a
/// byte (Q8_0) or a nibble per quant, then the bit planes.
pub(crate) fn block_bytes(dtype: DType) -> usize {
    let quants = if dtype == DType::Q8_0 { PANEL_ROWS * QK } else { NIBBLES };
    header_bytes(dtype) + quants + planes(dtype) * PLANE
}

/// Bytes of one row group's panel.
pub(crate) fn panel_bytes(dtype: DType, cols: usize) -> usize {
    (cols / QK) * block_bytes(dtype) + (cols / QK_K) * super_header_bytes(dtype)
}

/// Bytes of a `rows × cols` matrix in panel layout (rows padded to 16).
pub fn packed_len(dtype: DType, rows: usize, cols: usize) -> usize {
    rows.div_ceil(PANEL_ROWS) * panel_bytes(dtype, cols)
}

/// Where column `k`'s quant of lane `i` lives: (nibble byte, high nibble?).
#[inline]
pub(super) fn nibble_at(i: usize, k: usize) -> (usize, bool) {
    let kk = k % 16;
    ((kk / 4) * 64 + 4 * i + kk % 4, k >= 16)
}

/// Where Q6_K keeps the two high bits of column `k`'s quant of lane `i`
/// in a panel block's quant area: (byte, shift). The 128 bytes after the
/// nibbles are two "crumb" vectors laid out as the nibble vectors are
/// (byte `4i + k % 4` holds lane `i`); crumb vector `v` serves nibble
/// vectors `2v` and `2v + 1`, each byte holding four 2-bit fields: the
/// low-nibble column and the high-nibble column of the first vector
/// (bits 0–1, 2–3), then of the second (bits 4–5, 6–7). One shift and one
/// mask then put a field at bits 4–5 of every byte, where a bitwise select
/// joins it to the nibble: cheaper than a masked add per bit plane.
#[inline]
pub(super) fn crumb_at(i: usize, k: usize) -> (usize, u32) {
    let (kk, high) = (k % 16, (k >= 16) as usize);
    let j = kk / 4;
    (NIBBLES + 64 * (j / 2) + 4 * i + kk % 4, (2 * (2 * (j % 2) + high)) as u32)
}

/// Column `k`'s quant of lane `i` from a panel block's quant area.
#[inline]
pub(super) fn quant_at(dtype: DType, quants: &[u8], i: usize, k: usize) -> u8 {
    if dtype == DType::Q8_0 {
        return quants[(k / 4) * 64 + 4 * i + k % 4];
    }
    let (at, high) = nibble_at(i, k);
    let mut v = if high { quants[at] >> 4 } else { quants[at] & 0x0f };
    if dtype == DType::Q6_K {
        let (at, shift) = crumb_at(i, k);
        return v | (((quants[at] >> shift) & 3) << 4);
    }
    for p in 0..planes(dtype) {
        let m = NIBBLES + p * PLANE + 8 * (k / 4);
        let mask = u64::from_le_bytes(quants[m..m + 8].try_into().unwrap());
        v |= (((mask >> (4 * i + k % 4)) & 1) as u8) << (4 + p);
    }
    v
}

/// `n` activation rows quantized to 8 bits per block of 32: `q` (n × cols),
/// per block the scale `d` (`x ≈ d · q`), `s = d · Σ q` (for the weights'
/// minimums), both n × blocks, and for Q6_K weights the exact sums of `q`
/// over each block's halves (n × blocks × 2, for its offset of 32 under
/// 16-column scales).
#[derive(Default)]
pub struct Activations {
    pub(super) cols: usize,
    pub(super) q: Vec<i8>,
    pub(super) d: Vec<f32>,
    pub(super) s: Vec<f32>,
    pub(super) h: Vec<i32>,
}

impl Activations {
    pub(super) fn blocks(&self) -> usize {
        self.cols / QK
    }

    /// Raw parts for the SIMD kernels: (quants, scales, sums, half sums,
    /// cols).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn parts(&self) -> (&[i8], &[f32], &[f32], &[i32], usize) {
        (&self.q, &self.d, &self.s, &self.h, self.cols)
    }
}

/// Micro-kernel: rows `16g..16g + 16` (the panel `panel`, all blocks of one
/// row group) times tokens `t0..t0 + nt` (`nt ≤ TILE_TOKENS`) of `x`;
/// `out[j][i]` = row `i` · token `t0 + j`.
pub type TileFn = fn(DType, &[u8], &Activations, usize, usize, &mut Tile);

/// A micro-kernel's output: `out[j][i]` = row `i` · token `t0 + j`.
pub type Tile = [[f32; PANEL_ROWS]; TILE_TOKENS];
