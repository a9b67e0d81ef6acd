//! Integer products for the block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
//! the K-quants Q4_K, Q5_K and Q6_K: the activations are quantized to 8 bits
//! per block of 32 (one f32 scale per block, as GGML's Q8 activations) and
//! every product of a 32-column weight block with an activation block is an
//! exact integer sum (AVX-512 VNNI `vpdpbusd`: 64 unsigned × signed byte
//! products per instruction), scaled once per block (twice for Q6_K, whose
//! scales cover 16 columns). That replaces dequantizing every weight to f32,
//! which is what bounds the f32 path on a small quantized model.
//!
//! The weights are repacked once, at load, into panels of [`PANEL_ROWS`]
//! rows. Per block of 32 columns a panel block holds a header (the 16 rows'
//! scales and minimums), the quants interleaved so that one 64-byte load
//! holds four consecutive quants of each of the 16 rows — one row per 32-bit
//! lane, so the sums come out as a vector of 16 rows with no horizontal
//! reduction — and, for the 5-bit formats, bit planes (Q6_K: its high bits
//! as 2-bit "crumbs" beside the nibbles, see `crumb_at`). The K-quants
//! keep their super-block's f16 `d` (and `dmin`) once per 256 columns, in a
//! super-block header before its 8 blocks, as the file does: a decode step
//! is bound by the bytes it streams, so the panels should be no larger than
//! the file's blocks.
//!
//! | format | super-block header (16 rows) | block header (16 rows) | quants | high bits | bits per weight (file) |
//! |---|---|---|---|---|---|
//! | Q8_0 | — | 64 B: f16 `d` | 512 B: `q + 128` | — | 9.0 (8.5) |
//! | Q4_0, Q4_1 | — | 64 B: f16 `d`, f16 `m` | 256 B nibbles | — | 5.0 (4.5, 5.0) |
//! | Q5_0, Q5_1 | — | 64 B: f16 `d`, f16 `m` | 256 B nibbles | bit 4 | 6.0 (5.5, 6.0) |
//! | Q4_K | 64 B: f16 `d`, `dmin` | 32 B: u8 `sc`, `m` | 256 B nibbles | — | 4.625 (4.5) |
//! | Q5_K | 64 B: f16 `d`, `dmin` | 32 B: u8 `sc`, `m` | 256 B nibbles | bit 4 | 5.625 (5.5) |
//! | Q6_K | 32 B: f16 `d` | 32 B: i8 `sc` of both halves | 256 B nibbles | bits 4, 5 as crumbs | 6.5625 (6.5625) |
//!
//! Nibble byte `4j + b` of lane `i` holds column `4j + b` (low nibble) and
//! `16 + 4j + b` (high nibble); bit plane `p` is 8 little-endian `u64`
//! masks, mask `c / 4` bit `4i + c % 4` being bit `4 + p` of column `c`'s
//! quant, so a masked byte add restores it. A K-quant block's header holds
//! its 6-bit scale and minimum as a byte each (Q6_K: its two 8-bit scales),
//! and the kernels form `d·sc` and `−dmin·m` with the super-block's `d` and
//! `dmin` (exact f32 products, as GGML's dequantizer forms them); every bit
//! of the file's super-block header is there, so [`unpack_row`] restores
//! the file's bytes exactly and [`dequantize_row`] is GGML's dequantization
//! bit for bit. The high bits cost what the file's own fifth and sixth
//! bits cost; Q6_K's panels are exactly the file's size, and the K-quants'
//! byte-wide 6-bit scales are Q4_K's remaining 1.028× (Q5_K 1.023×).
//!
//! Every output is computed lane by lane with the same operations whatever
//! the number of tokens, so a product over `n` tokens equals `n` single-token
//! products bit for bit, and the portable [`scalar_tile`] equals the SIMD
//! kernel bit for bit (the integer sums are exact; each block then adds
//! `isum · (d · dx)` and `m · sx` with fused multiply-adds, in that order;
//! Q6_K adds `(isum_h − 32·Σx_h) · (d_h · dx)` for its halves `h` = 0, 1,
//! with `Σx_h` the activation quants' exact sum over the half).

use crate::dtype::DType;
use crate::f16::f16_to_f32;
use crate::quant::{QK, QK_K};
use rayon::prelude::*;
use std::sync::OnceLock;

/// Weight rows per panel: one per 32-bit lane of a 512-bit vector.
pub const PANEL_ROWS: usize = 16;
/// Tokens per micro-tile: 8 integer and 8 f32 accumulators, 16 of the 32
/// vector registers.
pub const TILE_TOKENS: usize = 8;
/// Bytes of a panel block's f16 header: 16 f16 scales, then 16 f16
/// minimums; the quants follow it.
pub(crate) const HEADER: usize = 64;
/// Offset of the minimums inside a panel block's f16 header.
pub(crate) const MIN_OFFSET: usize = 32;
/// Bytes of a K-quant block's header: the 16 rows' 6-bit scales at
/// [`K_SCALE_OFFSET`] and minimums at [`K_MIN_OFFSET`], a byte each (Q6_K:
/// the two halves' i8 scales at the same offsets). The super-block's f16
/// `d` (and `dmin`, at [`MIN_OFFSET`]) are in the super-block header.
pub(crate) const K_HEADER: usize = 32;
/// Offset of the K-quant scales inside a block header.
pub(crate) const K_SCALE_OFFSET: usize = 0;
/// Offset of the K-quant minimums (Q6_K: second half's scales) inside a
/// block header.
pub(crate) const K_MIN_OFFSET: usize = PANEL_ROWS;
/// Blocks of 32 columns per K-quant super-block.
const SUPER: usize = QK_K / QK;
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

fn is_k_quant(dtype: DType) -> bool {
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
fn super_header_bytes(dtype: DType) -> usize {
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
fn nibble_at(i: usize, k: usize) -> (usize, bool) {
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
fn crumb_at(i: usize, k: usize) -> (usize, u32) {
    let (kk, high) = (k % 16, (k >= 16) as usize);
    let j = kk / 4;
    (NIBBLES + 64 * (j / 2) + 4 * i + kk % 4, (2 * (2 * (j % 2) + high)) as u32)
}

/// Writes row `i`'s 32 quants (`q`, unsigned, as the kernels multiply them)
/// into a panel block's quant area (`quants`, after the header).
fn put_quants(dtype: DType, q: &[u8; QK], i: usize, quants: &mut [u8]) {
    if dtype == DType::Q8_0 {
        for (k, &v) in q.iter().enumerate() {
            quants[(k / 4) * 64 + 4 * i + k % 4] = v;
        }
        return;
    }
    for (k, &v) in q.iter().enumerate() {
        let (at, high) = nibble_at(i, k);
        quants[at] |= if high { (v & 0x0f) << 4 } else { v & 0x0f };
        if dtype == DType::Q6_K {
            let (at, shift) = crumb_at(i, k);
            quants[at] |= ((v >> 4) & 3) << shift;
            continue;
        }
        for p in 0..planes(dtype) {
            let bit = ((v >> (4 + p)) & 1) as u64;
            let m = NIBBLES + p * PLANE + 8 * (k / 4);
            let mut mask = u64::from_le_bytes(quants[m..m + 8].try_into().unwrap());
            mask |= bit << (4 * i + k % 4);
            quants[m..m + 8].copy_from_slice(&mask.to_le_bytes());
        }
    }
}

/// Column `k`'s quant of lane `i` from a panel block's quant area.
#[inline]
fn quant_at(dtype: DType, quants: &[u8], i: usize, k: usize) -> u8 {
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

fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// One row's header values in one panel block: f16 bits of `d` and of
/// `m` (Q4_K/Q5_K: `dmin`), and the K-quants' integer scales (Q4_K/Q5_K:
/// scale and minimum; Q6_K: the two halves' scales, as bytes).
#[derive(Clone, Copy, Default)]
struct Head {
    d: u16,
    m: u16,
    sc: [u8; 2],
}

/// One stored block (`src`: 32 or 256 elements) as the panel holds it: per
/// 32 columns the unsigned quants and the header values.
fn split_block(dtype: DType, src: &[u8], q: &mut [[u8; QK]], head: &mut [Head]) {
    let nib = |b: u8, high: bool| if high { b >> 4 } else { b & 0x0f };
    let f16 = |at: usize| u16::from_le_bytes([src[at], src[at + 1]]);
    match dtype {
        DType::Q8_0 => {
            head[0] = Head { d: f16(0), ..Head::default() };
            (0..QK).for_each(|k| q[0][k] = src[2 + k] ^ 0x80); // q + 128
        }
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => {
            let (m, qh, qs) = match dtype {
                DType::Q4_0 => (0, None, 2),
                DType::Q4_1 => (f16(2), None, 4),
                DType::Q5_0 => (0, Some(2), 6),
                _ => (f16(2), Some(4), 8),
            };
            head[0] = Head { d: f16(0), m, sc: [0; 2] };
            let qh = qh.map_or(0, |at| u32::from_le_bytes(src[at..at + 4].try_into().unwrap()));
            for k in 0..QK {
                q[0][k] = nib(src[qs + k % 16], k >= 16) | ((((qh >> k) & 1) as u8) << 4);
            }
        }
        DType::Q4_K | DType::Q5_K => {
            let five = dtype == DType::Q5_K;
            let (qh, qs) = (&src[16..48], &src[if five { 48 } else { 16 }..]);
            for g in 0..QK_K / QK {
                let (s, m) = crate::quant::k4_scale_min(&src[4..16], g);
                head[g] = Head { d: f16(0), m: f16(2), sc: [s, m] };
                for l in 0..QK {
                    let hi = if five { ((qh[l] >> g) & 1) << 4 } else { 0 };
                    q[g][l] = nib(qs[32 * (g / 2) + l], g % 2 == 1) | hi;
                }
            }
        }
        DType::Q6_K => {
            let (ql, qh, sc) = (&src[0..128], &src[128..192], &src[192..208]);
            for b in 0..QK_K / QK {
                head[b] = Head { d: f16(208), m: 0, sc: [sc[2 * b], sc[2 * b + 1]] };
                let (h, k) = (b / 4, b % 4);
                for l in 0..QK {
                    let lo = nib(ql[64 * h + 32 * (k % 2) + l], k >= 2);
                    q[b][l] = lo | (((qh[32 * h + l] >> (2 * k)) & 3) << 4);
                }
            }
        }
        _ => unreachable!("{dtype} has no integer path"),
    }
}

/// The inverse of [`split_block`]: the stored block from its quants and
/// header values.
fn join_block(dtype: DType, q: &[[u8; QK]], head: &[Head], dst: &mut [u8]) {
    let pair = |q: &[u8; QK], j: usize| (q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4);
    let qh = |q: &[u8; QK]| (0..QK).fold(0u32, |a, k| a | ((((q[k] >> 4) & 1) as u32) << k));
    let (d, m) = (head[0].d.to_le_bytes(), head[0].m.to_le_bytes());
    match dtype {
        DType::Q8_0 => {
            dst[0..2].copy_from_slice(&d);
            (0..QK).for_each(|k| dst[2 + k] = q[0][k] ^ 0x80);
        }
        DType::Q4_0 => {
            dst[0..2].copy_from_slice(&d);
            (0..16).for_each(|j| dst[2 + j] = pair(&q[0], j));
        }
        DType::Q4_1 => {
            dst[0..2].copy_from_slice(&d);
            dst[2..4].copy_from_slice(&m);
            (0..16).for_each(|j| dst[4 + j] = pair(&q[0], j));
        }
        DType::Q5_0 => {
            dst[0..2].copy_from_slice(&d);
            dst[2..6].copy_from_slice(&qh(&q[0]).to_le_bytes());
            (0..16).for_each(|j| dst[6 + j] = pair(&q[0], j));
        }
        DType::Q5_1 => {
            dst[0..2].copy_from_slice(&d);
            dst[2..4].copy_from_slice(&m);
            dst[4..8].copy_from_slice(&qh(&q[0]).to_le_bytes());
            (0..16).for_each(|j| dst[8 + j] = pair(&q[0], j));
        }
        DType::Q4_K | DType::Q5_K => {
            dst[0..2].copy_from_slice(&d);
            dst[2..4].copy_from_slice(&m);
            // the inverse of `quant::k4_scale_min`
            let (s, mn) = (|g: usize| head[g].sc[0], |g: usize| head[g].sc[1]);
            for j in 0..4 {
                dst[4 + j] = (s(j) & 63) | ((s(j + 4) >> 4) << 6);
                dst[8 + j] = (mn(j) & 63) | ((mn(j + 4) >> 4) << 6);
                dst[12 + j] = (s(j + 4) & 0x0f) | ((mn(j + 4) & 0x0f) << 4);
            }
            let five = dtype == DType::Q5_K;
            let qs = if five { 48 } else { 16 };
            for c in 0..4 {
                for l in 0..QK {
                    dst[qs + 32 * c + l] = (q[2 * c][l] & 0x0f) | ((q[2 * c + 1][l] & 0x0f) << 4);
                }
            }
            if five {
                for l in 0..QK {
                    dst[16 + l] = (0..8).fold(0u8, |a, g| a | (((q[g][l] >> 4) & 1) << g));
                }
            }
        }
        DType::Q6_K => {
            dst[..192].fill(0);
            for (b, qb) in q.iter().enumerate().take(QK_K / QK) {
                let (h, k) = (b / 4, b % 4);
                for (l, &v) in qb.iter().enumerate() {
                    dst[64 * h + 32 * (k % 2) + l] |= (v & 0x0f) << (4 * (k / 2));
                    dst[128 + 32 * h + l] |= (v >> 4) << (2 * k);
                }
                dst[192 + 2 * b..194 + 2 * b].copy_from_slice(&head[b].sc);
            }
            dst[208..210].copy_from_slice(&d);
        }
        _ => unreachable!("{dtype} has no integer path"),
    }
}

/// Repacks `rows` rows in the original block layout (`raw`) into panels
/// written to `out` (`packed_len` bytes; padding rows are zero). Panels are
/// independent, so they are packed in parallel (a 1.5B model's load is
/// otherwise mostly this loop on one core).
pub fn pack(dtype: DType, rows: usize, cols: usize, raw: &[u8], out: &mut [u8]) {
    debug_assert!(supports(dtype));
    let (be, rb) = (dtype.block_elems(), dtype.block_bytes());
    let (sub, bb, hb, pb) = (be / QK, block_bytes(dtype), header_bytes(dtype), panel_bytes(dtype, cols));
    out.par_chunks_mut(pb).enumerate().for_each(|(g, panel)| {
        let mut q = [[0u8; QK]; QK_K / QK];
        let mut head = [Head::default(); QK_K / QK];
        panel.fill(0);
        for r in g * PANEL_ROWS..((g + 1) * PANEL_ROWS).min(rows) {
            let i = r % PANEL_ROWS;
            for s in 0..cols / be {
                let src = &raw[(r * (cols / be) + s) * rb..][..rb];
                split_block(dtype, src, &mut q[..sub], &mut head[..sub]);
                for (j, (qj, hj)) in q.iter().zip(&head).take(sub).enumerate() {
                    let (at, dh) = block_at(dtype, s * sub + j);
                    panel[dh + 2 * i..][..2].copy_from_slice(&hj.d.to_le_bytes());
                    if dtype != DType::Q6_K {
                        panel[dh + MIN_OFFSET + 2 * i..][..2].copy_from_slice(&hj.m.to_le_bytes());
                    }
                    let dst = &mut panel[at..][..bb];
                    if is_k_quant(dtype) {
                        (dst[K_SCALE_OFFSET + i], dst[K_MIN_OFFSET + i]) = (hj.sc[0], hj.sc[1]);
                    }
                    put_quants(dtype, qj, i, &mut dst[hb..]);
                }
            }
        }
    });
}

/// Writes row `r`'s original block bytes (as stored in the file) into `raw`.
pub fn unpack_row(dtype: DType, packed: &[u8], cols: usize, r: usize, raw: &mut [u8]) {
    let (be, rb, pb) = (dtype.block_elems(), dtype.block_bytes(), panel_bytes(dtype, cols));
    let panel = &packed[r / PANEL_ROWS * pb..][..pb];
    for s in 0..cols / be {
        unpack_stored_block(dtype, panel, s, r % PANEL_ROWS, &mut raw[s * rb..(s + 1) * rb]);
    }
}

/// Lane `i`'s stored block `s` (the file's bytes, `raw`) from its row
/// group's `panel`.
fn unpack_stored_block(dtype: DType, panel: &[u8], s: usize, i: usize, raw: &mut [u8]) {
    let (sub, bb, hb) = (dtype.block_elems() / QK, block_bytes(dtype), header_bytes(dtype));
    let mut q = [[0u8; QK]; QK_K / QK];
    let mut head = [Head::default(); QK_K / QK];
    let f16 = |at: usize| u16::from_le_bytes([panel[at], panel[at + 1]]);
    for (j, (qj, hj)) in q.iter_mut().zip(&mut head).take(sub).enumerate() {
        let (at, dh) = block_at(dtype, s * sub + j);
        let blk = &panel[at..][..bb];
        (0..QK).for_each(|k| qj[k] = quant_at(dtype, &blk[hb..], i, k));
        let m = if dtype == DType::Q6_K { 0 } else { f16(dh + MIN_OFFSET + 2 * i) };
        *hj = Head { d: f16(dh + 2 * i), m, sc: [0; 2] };
        if is_k_quant(dtype) {
            hj.sc = [blk[K_SCALE_OFFSET + i], blk[K_MIN_OFFSET + i]];
        }
    }
    join_block(dtype, &q[..sub], &head[..sub], raw);
}

/// Dequantizes row `r` of a panel matrix into `out` (`cols` values), bit
/// for bit as [`crate::quant::dequantize`] of the original row; one stored
/// block at a time on the stack (embedding lookups run it every token).
pub fn dequantize_row(dtype: DType, packed: &[u8], cols: usize, r: usize, out: &mut [f32]) {
    let (be, rb, pb) = (dtype.block_elems(), dtype.block_bytes(), panel_bytes(dtype, cols));
    let panel = &packed[r / PANEL_ROWS * pb..][..pb];
    let mut raw = [0u8; 256]; // the largest stored block (Q6_K: 210 bytes)
    for s in 0..cols / be {
        unpack_stored_block(dtype, panel, s, r % PANEL_ROWS, &mut raw[..rb]);
        crate::quant::dequantize(dtype, &raw[..rb], &mut out[s * be..(s + 1) * be]);
    }
}

/// `n` activation rows quantized to 8 bits per block of 32: `q` (n × cols),
/// per block the scale `d` (`x ≈ d · q`), `s = d · Σ q` (for the weights'
/// minimums), both n × blocks, and for Q6_K weights the exact sums of `q`
/// over each block's halves (n × blocks × 2, for its offset of 32 under
/// 16-column scales).
#[derive(Default)]
pub struct Activations {
    cols: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    h: Vec<i32>,
}

impl Activations {
    /// Quantizes the `n × cols` row-major `x` for a product with `dtype`
    /// weights, reusing this value's buffers (with AVX-512 when the integer
    /// micro-kernel is in use; the result is the same bit for bit). The half
    /// sums only Q6_K reads are computed for Q6_K alone.
    pub fn quantize(&mut self, dtype: DType, x: &[f32], n: usize, cols: usize) {
        let blocks = cols / QK;
        self.cols = cols;
        self.q.resize(n * cols, 0);
        self.d.resize(n * blocks, 0.0);
        self.s.resize(n * blocks, 0.0);
        let x = &x[..n * cols];
        #[cfg(target_arch = "x86_64")]
        let simd = vnni_tile().is_some();
        #[cfg(not(target_arch = "x86_64"))]
        let simd = false;
        if simd {
            #[cfg(target_arch = "x86_64")]
            crate::simd::avx512::int8_quantize(x, &mut self.q, &mut self.d, &mut self.s);
        } else {
            quantize_blocks(x, &mut self.q, &mut self.d, &mut self.s);
        }
        if dtype == DType::Q6_K {
            self.h.resize(2 * n * blocks, 0);
            half_sums(&self.q, &mut self.h);
        }
    }

    fn blocks(&self) -> usize {
        self.cols / QK
    }

    /// Raw parts for the SIMD kernels: (quants, scales, sums, half sums,
    /// cols).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn parts(&self) -> (&[i8], &[f32], &[f32], &[i32], usize) {
        (&self.q, &self.d, &self.s, &self.h, self.cols)
    }
}

/// The sums of every 16 quants of `q` (integers: exact in any order).
fn half_sums(q: &[i8], h: &mut [i32]) {
    for (qh, h) in q.chunks_exact(QK / 2).zip(h) {
        *h = qh.iter().map(|&v| v as i32).sum();
    }
}

/// The portable activation quantizer, per block of 32: `d = amax / 127`,
/// `q = round_ties_even(x / d)` (as `x · (1 / d)`, clamped to ±127), `s = d ·
/// Σ q`. A zero block gets `d = 0` and zero quants. Non-finite activations
/// give unspecified (but bounded) quants.
pub fn quantize_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((xb, qb), d), s) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).zip(d).zip(s) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
            sum += *q as i32;
        }
        *d = scale;
        *s = scale * sum as f32;
    }
}

/// Micro-kernel: rows `16g..16g + 16` (the panel `panel`, all blocks of one
/// row group) times tokens `t0..t0 + nt` (`nt ≤ TILE_TOKENS`) of `x`;
/// `out[j][i]` = row `i` · token `t0 + j`.
pub type TileFn = fn(DType, &[u8], &Activations, usize, usize, &mut Tile);

/// A micro-kernel's output: `out[j][i]` = row `i` · token `t0 + j`.
pub type Tile = [[f32; PANEL_ROWS]; TILE_TOKENS];

/// Row `i`'s two header values for a panel block: the scale and the
/// minimum (Q6_K: the scales of the two halves), from the block `blk` and
/// the header `dh` holding its `d` (its own, or its super-block's).
#[inline]
fn scale_min(dtype: DType, blk: &[u8], dh: &[u8], i: usize) -> (f32, f32) {
    let d = half(dh, 2 * i);
    match dtype {
        DType::Q4_K | DType::Q5_K => {
            let dmin = half(dh, MIN_OFFSET + 2 * i);
            (d * blk[K_SCALE_OFFSET + i] as f32, -dmin * blk[K_MIN_OFFSET + i] as f32)
        }
        DType::Q6_K => {
            let s = |at: usize| d * (blk[at + i] as i8) as f32;
            (s(K_SCALE_OFFSET), s(K_MIN_OFFSET))
        }
        DType::Q4_1 | DType::Q5_1 => (d, half(dh, MIN_OFFSET + 2 * i)),
        DType::Q4_0 => (d, d * -8.0),
        DType::Q5_0 => (d, d * -16.0),
        _ => (d, d * -128.0),
    }
}

/// The portable micro-kernel: the arithmetic every SIMD version reproduces
/// bit for bit.
pub fn scalar_tile(dtype: DType, panel: &[u8], x: &Activations, t0: usize, nt: usize, out: &mut Tile) {
    let (blocks, bb, hb, cols) = (x.blocks(), block_bytes(dtype), header_bytes(dtype), x.cols);
    for (j, o) in out.iter_mut().enumerate().take(nt) {
        let t = t0 + j;
        let xq = &x.q[t * cols..(t + 1) * cols];
        for (i, acc) in o.iter_mut().enumerate() {
            let mut sum = 0f32;
            for b in 0..blocks {
                let (at, dh) = block_at(dtype, b);
                let blk = &panel[at..at + bb];
                let (d, m) = scale_min(dtype, blk, &panel[dh..], i);
                let xb = &xq[b * QK..(b + 1) * QK];
                let mut isum = [0i32; 2];
                for (k, &xk) in xb.iter().enumerate() {
                    isum[k / 16] += quant_at(dtype, &blk[hb..], i, k) as i32 * xk as i32;
                }
                let at = t * blocks + b;
                let xd = x.d[at];
                if dtype == DType::Q6_K {
                    let (h0, h1) = (x.h[2 * at], x.h[2 * at + 1]);
                    sum = ((isum[0] - 32 * h0) as f32).mul_add(d * xd, sum);
                    sum = ((isum[1] - 32 * h1) as f32).mul_add(m * xd, sum);
                } else {
                    sum = ((isum[0] + isum[1]) as f32).mul_add(d * xd, sum);
                    sum = m.mul_add(x.s[at], sum);
                }
            }
            *acc = sum;
        }
    }
}

/// The fastest micro-kernel this CPU has, if the integer path is enabled:
/// AVX-512 VNNI, unless `KVSLIM_INT8=0` or `KVSLIM_SIMD` asks for a lower
/// level. `None` keeps the f32 path (weights dequantized, f32 activations).
pub fn tile_kernel() -> Option<TileFn> {
    static TILE: OnceLock<Option<TileFn>> = OnceLock::new();
    *TILE.get_or_init(|| {
        let off = std::env::var("KVSLIM_INT8").is_ok_and(|v| matches!(v.trim(), "0" | "off" | "false"));
        if off || crate::dot::kernels().isa != crate::dot::Isa::Avx512 {
            return None;
        }
        vnni_tile()
    })
}

/// The VNNI micro-kernel when the CPU has it (tests compare it with
/// [`scalar_tile`] directly). Detected once: every product asks.
pub fn vnni_tile() -> Option<TileFn> {
    static VNNI: OnceLock<Option<TileFn>> = OnceLock::new();
    *VNNI.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            crate::simd::avx512::int8_tile()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{Matrix, Products};
    use crate::quant::{dequantize, quantize};

    const DTYPES: [DType; 8] =
        [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K];

    /// Columns of the test shapes: `c` blocks of 32, or of 256 for the
    /// K-quants.
    fn cols_of(dt: DType, c: usize) -> usize {
        c * dt.block_elems()
    }

    /// Deterministic bytes (any bytes are a valid block of these formats).
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 56) as u8
            })
            .collect()
    }

    /// Byte offsets of a stored block's f16 scales (`d`, and `m` or `dmin`).
    fn f16_fields(dt: DType) -> &'static [usize] {
        match dt {
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
            DType::Q6_K => &[208],
            _ => &[0],
        }
    }

    /// Deterministic values with a spread of magnitudes and signs.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32;
                (u - 0.5) * if s & 1 == 0 { 4.0 } else { 0.25 }
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// Packs `raw` (`rows × cols` of `dt`) and checks that every row
    /// unpacks to its bytes and dequantizes to `dequantize`'s values, bit
    /// for bit; returns the panels.
    fn packed_rows_match(dt: DType, rows: usize, cols: usize, raw: &[u8]) -> Vec<u8> {
        let mut packed = vec![0u8; packed_len(dt, rows, cols)];
        pack(dt, rows, cols, raw, &mut packed);
        let rb = dt.bytes_for(cols);
        let mut back = vec![0u8; rb];
        for r in 0..rows {
            unpack_row(dt, &packed, cols, r, &mut back);
            assert_eq!(back, raw[r * rb..(r + 1) * rb], "{dt} {rows}x{cols} row {r}");
            let (mut want, mut got) = (vec![0f32; cols], vec![0f32; cols]);
            dequantize(dt, &raw[r * rb..(r + 1) * rb], &mut want);
            dequantize_row(dt, &packed, cols, r, &mut got);
            assert_eq!(bits(&want), bits(&got), "{dt} {rows}x{cols} row {r}");
        }
        packed
    }

    #[test]
    fn panels_keep_every_row_bit_for_bit() {
        for dt in DTYPES {
            for (rows, c) in [(1, 1), (17, 2), (40, 3)] {
                let cols = cols_of(dt, c);
                packed_rows_match(dt, rows, cols, &quantize(dt, &values(rows * cols, 3)));
            }
        }
    }

    /// Random bytes are valid blocks of every format: pack → unpack gives
    /// them back, `dequantize_row` equals `dequantize` bit for bit, and
    /// `set_products(F32)` restores the original bytes, with extreme f16
    /// scales (zero, ±subnormal, ±max, ±inf, NaN) in some blocks.
    #[test]
    fn random_blocks_survive_pack_and_set_products() {
        let extremes = [0x0000u16, 0x8000, 0x0001, 0x83ff, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e01, 0x3c00];
        for dt in DTYPES {
            for (rows, c) in [(3, 1), (19, 2), (33, 5)] {
                let cols = cols_of(dt, c);
                let mut raw = bytes(dt.bytes_for(cols) * rows, 17 + rows as u64);
                for (b, blk) in raw.chunks_exact_mut(dt.block_bytes()).enumerate() {
                    for (f, &at) in f16_fields(dt).iter().enumerate() {
                        if (b + f) % 3 != 0 {
                            let v = extremes[(b * 7 + f) % extremes.len()];
                            blk[at..at + 2].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
                let packed = packed_rows_match(dt, rows, cols, &raw);
                let mut m = Matrix::from_bytes_with(dt, rows, cols, &raw, Products::Int8).unwrap();
                assert_eq!((m.products(), m.nbytes()), (Products::Int8, packed.len()));
                m.set_products(Products::F32);
                assert_eq!(m.products(), Products::F32);
                let mut f = vec![0f32; rows * cols];
                dequantize(dt, &raw, &mut f);
                assert_eq!(bits(&m.to_f32()), bits(&f), "{dt} {rows}x{cols}");
                m.set_products(Products::Int8);
                assert_eq!(bits(&m.to_f32()), bits(&f), "{dt} {rows}x{cols}");
            }
        }
    }

    /// Bits per weight of the panels of `dt` (the module doc's table).
    fn panel_bits(dt: DType) -> f64 {
        match dt {
            DType::Q8_0 => 9.0,
            DType::Q4_0 | DType::Q4_1 => 5.0,
            DType::Q5_0 | DType::Q5_1 => 6.0,
            DType::Q4_K => 4.625,
            DType::Q5_K => 5.625,
            DType::Q6_K => 6.5625,
            _ => unreachable!("{dt} has no panels"),
        }
    }

    /// Bytes per weight of the panels against the file's.
    #[test]
    fn panel_sizes_are_as_documented() {
        let (rows, cols) = (64, 1024);
        for dt in DTYPES {
            let bits = packed_len(dt, rows, cols) as f64 * 8.0 / (rows * cols) as f64;
            assert_eq!(bits, panel_bits(dt), "{dt}");
        }
    }

    #[test]
    fn activations_round_trip_within_half_a_step() {
        let x = values(3 * 64, 5);
        let mut a = Activations::default();
        a.quantize(DType::Q8_0, &x, 3, 64);
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let d = a.d[b];
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!((d - amax / 127.0).abs() <= 1e-7 * amax.max(1.0));
            let mut sum = 0i32;
            for (k, &v) in xb.iter().enumerate() {
                let q = a.q[b * QK + k];
                assert!((v - d * q as f32).abs() <= 0.5 * d * (1.0 + 1e-5), "block {b} [{k}]");
                sum += q as i32;
            }
            assert_eq!(a.s[b], d * sum as f32);
        }
        // an all-zero block has a zero scale and zero quants
        a.quantize(DType::Q8_0, &[0.0; 32], 1, 32);
        assert_eq!((a.d[0], a.s[0], a.q.iter().all(|&q| q == 0)), (0.0, 0.0, true));
    }

    /// The SIMD activation quantizer is the scalar one, bit for bit
    /// (including ties: values at exactly half a step).
    #[test]
    fn simd_quantizer_equals_scalar() {
        if vnni_tile().is_none() {
            eprintln!("no AVX-512 VNNI on this CPU: nothing to compare");
            return;
        }
        let mut x = values(40 * QK, 21);
        // a block whose steps land on exact ties: amax 127 → d = 1
        for (k, v) in x[..QK].iter_mut().enumerate() {
            *v = k as f32 - 15.5;
        }
        x[QK - 1] = 127.0;
        x[2 * QK..3 * QK].fill(0.0);
        let mut a = Activations::default();
        a.quantize(DType::Q8_0, &x, 40, QK);
        let (mut q, mut d, mut s) = (vec![0i8; x.len()], vec![0f32; 40], vec![0f32; 40]);
        quantize_blocks(&x, &mut q, &mut d, &mut s);
        assert_eq!(a.q, q);
        assert_eq!(
            a.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            d.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            a.s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            s.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // ties go to even: -15.5 → -16, 0.5 → 0, 1.5 → 2
        assert_eq!((q[0], q[15], q[16], q[17]), (-16, 0, 0, 2));
    }

    /// The SIMD micro-kernel is the scalar one, bit for bit, on every
    /// format and token count (extreme activations included).
    #[test]
    fn vnni_tile_equals_scalar_tile_bit_for_bit() {
        let Some(vnni) = vnni_tile() else {
            eprintln!("no AVX-512 VNNI on this CPU: nothing to compare");
            return;
        };
        for (dt, random) in DTYPES.into_iter().flat_map(|dt| [(dt, false), (dt, true)]) {
            // 37 rows: two full panels and one padded
            let (rows, cols, n) = (37, if dt.is_k_quant() { 512 } else { 160 }, 19);
            let raw = if random {
                // every quant and integer scale, finite f16 scales (2^-14..2)
                let mut raw = bytes(dt.bytes_for(cols) * rows, 23);
                for blk in raw.chunks_exact_mut(dt.block_bytes()) {
                    for &at in f16_fields(dt) {
                        blk[at + 1] = (blk[at + 1] & 0x83) | 0x04 | (blk[at] & 0x38);
                    }
                }
                raw
            } else {
                quantize(dt, &values(rows * cols, 7))
            };
            let mut packed = vec![0u8; packed_len(dt, rows, cols)];
            pack(dt, rows, cols, &raw, &mut packed);
            let mut x = values(n * cols, 9);
            x[5] = 1e6;
            x[40] = -3e-8;
            let mut a = Activations::default();
            a.quantize(dt, &x, n, cols);
            let pl = packed_len(dt, PANEL_ROWS, cols);
            for (g, panel) in packed.chunks_exact(pl).enumerate() {
                for t0 in [0, 3, 8, 16] {
                    for nt in 1..=TILE_TOKENS.min(n - t0) {
                        let (mut want, mut got) =
                            ([[0f32; PANEL_ROWS]; TILE_TOKENS], [[1f32; PANEL_ROWS]; TILE_TOKENS]);
                        scalar_tile(dt, panel, &a, t0, nt, &mut want);
                        vnni(dt, panel, &a, t0, nt, &mut got);
                        for j in 0..nt {
                            let bits = |v: &[f32; PANEL_ROWS]| v.map(f32::to_bits);
                            assert_eq!(bits(&got[j]), bits(&want[j]), "{dt} panel {g} t0={t0} nt={nt} token {j}");
                        }
                    }
                }
            }
        }
    }

    /// Integer products over `n` tokens: equal to `n` single-token products
    /// bit for bit, equal to the exact product of the quantized operands to
    /// f32 rounding, and within the activation quantization's error of the
    /// f32 product; ragged row counts and the threaded path included.
    #[test]
    fn integer_products_match_references() {
        for dt in DTYPES {
            for (rows, c, n) in [(5, 2, 3), (37, 3, 13), (600, 8, 9)] {
                let cols = if dt.is_k_quant() { c * 256 } else { c * 32 };
                let raw = quantize(dt, &values(rows * cols, 11));
                let m = Matrix::from_bytes_with(dt, rows, cols, &raw, Products::Int8).unwrap();
                assert_eq!(m.products(), Products::Int8);
                let w = m.to_f32();
                let x = values(n * cols, 13);
                let mut out = vec![f32::NAN; n * rows];
                m.matmul(&x, n, &mut out);
                let mut many = vec![f32::NAN; n * rows];
                m.matvec_many(&x, n, &mut many);
                let mut a = Activations::default();
                a.quantize(dt, &x, n, cols);
                for t in 0..n {
                    let mut one = vec![f32::NAN; rows];
                    m.matvec(&x[t * cols..(t + 1) * cols], &mut one);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&out[t * rows..(t + 1) * rows]), bits(&one), "{dt} token {t}");
                    assert_eq!(bits(&many[t * rows..(t + 1) * rows]), bits(&one), "{dt} token {t}");
                    for r in 0..rows {
                        let got = out[t * rows + r] as f64;
                        // exact product of the quantized operands (f64)
                        let (mut exact, mut mag, mut full) = (0f64, 0f64, 0f64);
                        for c in 0..cols {
                            let b = t * (cols / QK) + c / QK;
                            let xq = a.d[b] as f64 * a.q[t * cols + c] as f64;
                            exact += w[r * cols + c] as f64 * xq;
                            mag += (w[r * cols + c] as f64 * xq).abs();
                            full += w[r * cols + c] as f64 * x[t * cols + c] as f64;
                        }
                        assert!((got - exact).abs() <= 1e-5 * mag.max(1e-3), "{dt} [{t}][{r}]: {got} vs {exact}");
                        // each activation moves by at most half a step (amax/254)
                        let bound: f64 = (0..cols)
                            .map(|c| {
                                let xb = &x[t * cols + c / QK * QK..t * cols + c / QK * QK + QK];
                                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                                (w[r * cols + c] as f64).abs() * amax / 254.0
                            })
                            .sum();
                        assert!((got - full).abs() <= bound * 1.01 + 1e-5 * mag, "{dt} [{t}][{r}]");
                    }
                }
            }
        }
    }
}
