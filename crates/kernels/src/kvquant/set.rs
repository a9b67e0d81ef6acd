//! The shape of a KV group kernel set: the table [`super::group_kernels`]
//! picks and the ISA modules (`crate::simd`) fill, and the checks their
//! raw-pointer kernels rely on.

use super::format::KvDtype;
use crate::dot::set::Isa;

/// A group kernel on one coded row: `dot(data, scales, queries, out)` sets
/// `out[h] = queries_h · row` (`g = out.len()` heads of `d =
/// queries.len() / g`); `axpy(data, scales, probs, outs)` adds
/// `probs[h] · row` to `outs_h` (`d = outs.len() / probs.len()`).
pub type KvGroupFn = fn(&[u8], &[f32], &[f32], &mut [f32]);

/// Group kernels for coded KV rows, indexed F16, Q8, Q4 (F32 rows go
/// through [`crate::dot`]). Attention reads a row once for all query
/// heads of its group and converts it in registers, never to memory.
#[derive(Clone, Copy)]
pub struct KvGroupKernels {
    /// Instruction set (as in [`crate::dot::DotKernels::isa`]).
    pub isa: Isa,
    pub dot: [KvGroupFn; 3],
    pub axpy: [KvGroupFn; 3],
    /// Run kernels (see [`KvRunFn`]), where a set has them; otherwise
    /// runs go row by row through `dot` / `axpy`.
    pub dot_run: Option<[KvRunFn; 3]>,
    pub axpy_run: Option<[KvRunFn; 3]>,
}

/// A group kernel over a run of `n` consecutive rows (codes `stride` bytes
/// apart, side values `spr` apart; `n` is how many rows `codes` reaches):
/// `dot(codes, stride, scales, spr, queries, out)` sets `out[j·g + h] =
/// queries_h · row_j` (`queries` is `g × d`); `axpy(.., probs, outs)` adds
/// `Σ_j probs[j·g + h] · row_j` to `outs_h` (`outs` is `g × d`).
/// Bit for bit what the per-row kernels give, row after row (for finite
/// rows: a run also adds the rows whose weights are all zero).
pub type KvRunFn = fn(&[u8], usize, &[f32], usize, &[f32], &mut [f32]);

/// Rows, heads and width of a run (`n`, `g`, `d`), after checking that the
/// codes, side values, queries (or weights) and outputs cover them: the
/// SIMD run kernels read through raw pointers and rely on this. `n` is the
/// number of rows the codes hold (`codes = (n − 1)·stride + row bytes`).
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
pub(crate) fn check_run(
    kind: u8,
    codes: usize,
    stride: usize,
    scales: usize,
    spr: usize,
    a: usize,
    b: usize,
    dot: bool,
) -> (usize, usize, usize) {
    let dt = [KvDtype::F16, KvDtype::Q8, KvDtype::Q4][kind as usize];
    assert!(stride > 0, "run stride");
    let n = codes.div_ceil(stride);
    // dot: a = g·d queries, b = n·g scores; axpy: a = n·g weights, b = g·d outputs
    let g = if dot { b / n.max(1) } else { a / n.max(1) };
    let d = if dot { a.checked_div(g).unwrap_or(0) } else { b.checked_div(g).unwrap_or(0) };
    assert!(n * g == if dot { b } else { a }, "run of {n} rows × {g} heads");
    assert!(n == 0 || (codes >= (n - 1) * stride + dt.data_bytes(d) && stride >= dt.data_bytes(d)), "{dt} run codes");
    assert!(n == 0 || scales >= (n - 1) * spr + dt.scale_count(d), "{dt} run side values");
    (n, g, d)
}

/// Panics unless a coded row of kind `kind` (0 F16, 1 Q8, 2 Q4) has at least
/// the bytes and side values a row of `d` needs: the SIMD group kernels
/// read through raw pointers and rely on this.
#[inline]
pub(crate) fn check_group_row(kind: u8, d: usize, data: usize, scales: usize) {
    let dt = [KvDtype::F16, KvDtype::Q8, KvDtype::Q4][kind as usize];
    assert!(data >= dt.data_bytes(d) && scales >= dt.scale_count(d), "{dt} row too short for d = {d}");
}
