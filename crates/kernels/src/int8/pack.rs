//! Repacking stored block rows into panels ([`super::layout`]) and back:
//! once at load, and for a row's original bytes (embedding lookups).

use super::layout::*;
use crate::dtype::DType;
use crate::quant::{QK, QK_K};
use rayon::prelude::*;

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
