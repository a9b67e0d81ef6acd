//! One lane abstraction for the f32 SIMD loops, the way ggml's
//! `GGML_F32_VEC_*` macros serve every ISA: [`F32Lanes`] is a vector of
//! `N` f32 lanes (AVX2 8, AVX-512 16, NEON 4), and each loop below is
//! written once as an `#[inline(always)]` generic function. The ISA
//! modules instantiate them inside their `#[target_feature]` entry points,
//! so the generic code (and the intrinsics it calls) is compiled with that
//! entry point's features.
//!
//! The loops keep the exact order of floating-point operations of the
//! per-ISA kernels they replace (accumulator count, reduction order, FMA
//! where there was FMA), so results are bit-identical: a tail of `n < N`
//! elements is loaded zero-padded (AVX-512 with a masked load, the others
//! through a stack copy), which gives the same lanes either way.

// The KV, half-precision and GEMM parts have only x86 users so far.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

/// `N` f32 lanes. Every method is `unsafe`: the caller must run on a CPU
/// with the ISA's features (the `kernels()` detection) and pass pointers
/// valid for the lanes read or written.
pub(crate) trait F32Lanes {
    type V: Copy;
    const N: usize;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a·b + c`, fused.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// Sum of the lanes, in the ISA's usual order.
    unsafe fn reduce(v: Self::V) -> f32;

    #[inline(always)]
    unsafe fn zero() -> Self::V {
        Self::splat(0.0)
    }
    /// The first `n < N` lanes from `p`, the others zero (a zero-padded
    /// stack copy unless the ISA has masked loads).
    #[inline(always)]
    unsafe fn load_part(p: *const f32, n: usize) -> Self::V {
        let mut t = [0f32; MAX_N];
        std::ptr::copy_nonoverlapping(p, t.as_mut_ptr(), n);
        Self::load(t.as_ptr())
    }
    /// Stores the first `n < N` lanes of `v` to `p`.
    #[inline(always)]
    unsafe fn store_part(p: *mut f32, n: usize, v: Self::V) {
        let mut t = [0f32; MAX_N];
        Self::store(t.as_mut_ptr(), v);
        std::ptr::copy_nonoverlapping(t.as_ptr(), p, n);
    }
}

/// The widest vector's lane count (stack buffers for tails).
const MAX_N: usize = 16;

/// Methods of a lane trait that call one intrinsic each:
/// `name(args) -> ret = intrinsic;`, `<S>` for a shift count.
macro_rules! intrinsics {
    ($($name:ident $(<$s:ident>)? ($($arg:ident: $t:ty),*) $(-> $r:ty)? = $f:ident;)*) => {$(
        #[inline(always)]
        unsafe fn $name $(<const $s: i32>)? ($($arg: $t),*) $(-> $r)? {
            $f $(::<$s>)? ($($arg),*)
        }
    )*};
}
pub(crate) use intrinsics;

/// Implements [`F32Lanes`] for `$isa` from the ISA's intrinsics, the way
/// ggml maps `GGML_F32_VEC_*` to each instruction set.
macro_rules! f32_lanes {
    ($isa:ty, $v:ty, $n:expr, splat: $splat:ident, load: $load:ident, store: $store:ident,
     fma: |$a:ident, $b:ident, $c:ident| $fma:expr, add: $add:ident, mul: $mul:ident, reduce: $reduce:ident
     $(, $extra:item)* $(,)?) => {
        impl $crate::simd::lanes::F32Lanes for $isa {
            type V = $v;
            const N: usize = $n;
            $crate::simd::lanes::intrinsics! {
                splat(x: f32) -> $v = $splat;
                load(p: *const f32) -> $v = $load;
                store(p: *mut f32, v: $v) = $store;
                add(a: $v, b: $v) -> $v = $add;
                mul(a: $v, b: $v) -> $v = $mul;
                reduce(v: $v) -> f32 = $reduce;
            }
            #[inline(always)]
            unsafe fn fma($a: $v, $b: $v, $c: $v) -> $v {
                $fma
            }
            $($extra)*
        }
    };
}
pub(crate) use f32_lanes;

/// f16 (`BF` false) or bf16 (`BF` true) weights widened to `N` f32 lanes.
pub(crate) trait HalfLanes: F32Lanes {
    unsafe fn half<const BF: bool>(p: *const u16) -> Self::V;
    /// The first `n < N` values at `p` widened, the other lanes zero.
    #[inline(always)]
    unsafe fn half_part<const BF: bool>(p: *const u16, n: usize) -> Self::V {
        let mut t = [0u16; MAX_N];
        std::ptr::copy_nonoverlapping(p, t.as_mut_ptr(), n);
        Self::half::<BF>(t.as_ptr())
    }
}

/// A row of weights read `N` at a time as f32 lanes.
pub(crate) trait Row<L: F32Lanes> {
    type E;
    unsafe fn load(p: *const Self::E) -> L::V;
    unsafe fn load_part(p: *const Self::E, n: usize) -> L::V;
}

/// f32 weights.
pub(crate) struct F32Row;

impl<L: F32Lanes> Row<L> for F32Row {
    type E = f32;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> L::V {
        L::load(p)
    }
    #[inline(always)]
    unsafe fn load_part(p: *const f32, n: usize) -> L::V {
        L::load_part(p, n)
    }
}

/// f16 (`BF` false) or bf16 (`BF` true) weights.
pub(crate) struct HalfRow<const BF: bool>;

impl<L: HalfLanes, const BF: bool> Row<L> for HalfRow<BF> {
    type E = u16;
    #[inline(always)]
    unsafe fn load(p: *const u16) -> L::V {
        L::half::<BF>(p)
    }
    #[inline(always)]
    unsafe fn load_part(p: *const u16, n: usize) -> L::V {
        L::half_part::<BF>(p, n)
    }
}

/// Σ w·x over `n` elements: four accumulators over `4·N` elements a step,
/// then the tail: `N` at a time into the first and the zero-padded rest
/// into the second, or (`PAIRS`, NEON's f16 order) zero-padded steps of
/// `2·N` into the first two; `(s0 + s1) + (s2 + s3)` reduced.
#[inline(always)]
pub(crate) unsafe fn dot<L: F32Lanes, R: Row<L>, const PAIRS: bool>(w: *const R::E, x: *const f32, n: usize) -> f32 {
    let (mut s0, mut s1, mut s2, mut s3) = (L::zero(), L::zero(), L::zero(), L::zero());
    let mut i = 0;
    while i + 4 * L::N <= n {
        s0 = L::fma(R::load(w.add(i)), L::load(x.add(i)), s0);
        s1 = L::fma(R::load(w.add(i + L::N)), L::load(x.add(i + L::N)), s1);
        s2 = L::fma(R::load(w.add(i + 2 * L::N)), L::load(x.add(i + 2 * L::N)), s2);
        s3 = L::fma(R::load(w.add(i + 3 * L::N)), L::load(x.add(i + 3 * L::N)), s3);
        i += 4 * L::N;
    }
    if PAIRS {
        while i < n {
            let k = (n - i).min(2 * L::N);
            let (k0, k1) = (k.min(L::N), k.saturating_sub(L::N));
            s0 = L::fma(R::load_part(w.add(i), k0), L::load_part(x.add(i), k0), s0);
            let (w1, x1) = (w.wrapping_add(i + L::N), x.wrapping_add(i + L::N));
            s1 = L::fma(R::load_part(w1, k1), L::load_part(x1, k1), s1);
            i += k;
        }
    }
    while i + L::N <= n {
        s0 = L::fma(R::load(w.add(i)), L::load(x.add(i)), s0);
        i += L::N;
    }
    if i < n {
        s1 = L::fma(R::load_part(w.add(i), n - i), L::load_part(x.add(i), n - i), s1);
    }
    L::reduce(L::add(L::add(s0, s1), L::add(s2, s3)))
}

/// `n` f16 (`BF` false) or bf16 (`BF` true) values at `s` (any alignment)
/// to f32 at `o`, `N` at a time: the conversion is exact, so this is the
/// scalar conversion bit for bit.
#[inline(always)]
pub(crate) unsafe fn deq_half<L: HalfLanes, const BF: bool>(s: *const u8, o: *mut f32, n: usize) {
    let mut i = 0;
    while i + L::N <= n {
        L::store(o.add(i), L::half::<BF>(s.add(2 * i).cast()));
        i += L::N;
    }
    for j in i..n {
        let h = u16::from_le(std::ptr::read_unaligned(s.add(2 * j).cast::<u16>()));
        *o.add(j) = if BF { crate::f16::bf16_to_f32(h) } else { crate::f16::f16_to_f32(h) };
    }
}

/// Integer lanes for unpacking quants (AVX2: eight i32 lanes of one byte
/// each, NEON: sixteen bytes), the integer counterpart of [`F32Lanes`].
pub(crate) trait IntLanes {
    type I: Copy;
    /// The bytes at `p`, one a lane.
    unsafe fn bytes(p: *const u8) -> Self::I;
    unsafe fn splat_int(v: u8) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    /// Shifts left by `S`; only the low 8 bits of a lane are meaningful.
    unsafe fn shl<const S: i32>(a: Self::I) -> Self::I;
    unsafe fn shr<const S: i32>(a: Self::I) -> Self::I;
}

/// Implements [`IntLanes`] for `$isa` from the ISA's intrinsics.
macro_rules! int_lanes {
    ($isa:ty, $i:ty, bytes: $bytes:ident, splat: |$v:ident| $splat:expr, and: $and:ident, or: $or:ident,
     shl: $shl:ident, shr: $shr:ident) => {
        impl $crate::simd::lanes::IntLanes for $isa {
            type I = $i;
            $crate::simd::lanes::intrinsics! {
                bytes(p: *const u8) -> $i = $bytes;
                and(a: $i, b: $i) -> $i = $and;
                or(a: $i, b: $i) -> $i = $or;
                shl<S>(a: $i) -> $i = $shl;
                shr<S>(a: $i) -> $i = $shr;
            }
            #[inline(always)]
            unsafe fn splat_int($v: u8) -> $i {
                $splat
            }
        }
    };
}
pub(crate) use int_lanes;

/// The four 6-bit quants of Q6_K at byte `l` of each 32-byte run of the
/// half `h` of the super-block `p`, a lane each: quant k is nibble k / 2 of
/// ql byte 64h + 32(k % 2) + l with bits 2k..2k+1 of qh byte 128 + 32h + l
/// above it.
#[inline(always)]
pub(crate) unsafe fn q6_quants<L: IntLanes>(p: *const u8, h: usize, l: usize) -> [L::I; 4] {
    let (qa, qb, qh) =
        (L::bytes(p.add(64 * h + l)), L::bytes(p.add(64 * h + 32 + l)), L::bytes(p.add(128 + 32 * h + l)));
    let (m4, m30) = (L::splat_int(0x0f), L::splat_int(0x30));
    [
        L::or(L::and(qa, m4), L::and(L::shl::<4>(qh), m30)),
        L::or(L::and(qb, m4), L::and(L::shl::<2>(qh), m30)),
        L::or(L::shr::<4>(qa), L::and(qh, m30)),
        L::or(L::shr::<4>(qb), L::and(L::shr::<2>(qh), m30)),
    ]
}

/// `y += a·x` over `n` elements (each element one FMA, so the unrolling
/// does not change results).
#[inline(always)]
pub(crate) unsafe fn axpy<L: F32Lanes>(a: f32, x: *const f32, y: *mut f32, n: usize) {
    let va = L::splat(a);
    let mut i = 0;
    while i + 4 * L::N <= n {
        for k in 0..4 {
            let j = i + k * L::N;
            L::store(y.add(j), L::fma(va, L::load(x.add(j)), L::load(y.add(j))));
        }
        i += 4 * L::N;
    }
    while i + L::N <= n {
        L::store(y.add(i), L::fma(va, L::load(x.add(i)), L::load(y.add(i))));
        i += L::N;
    }
    if i < n {
        let v = L::fma(va, L::load_part(x.add(i), n - i), L::load_part(y.add(i), n - i));
        L::store_part(y.add(i), n - i, v);
    }
}

/// 4 weight rows × 4 activation rows (`out[r][c] = w_r · x_c`), in
/// passes of `C` activation rows (4·C accumulators, each weight load feeding
/// `C` FMAs). `PART`: the tail (`n % N`) is one more zero-padded vector
/// step; otherwise it is added in scalar after the lane sum.
#[inline(always)]
pub(crate) unsafe fn dot4x4<L: F32Lanes, const C: usize, const PART: bool>(
    w: &[*const f32; 4],
    x: &[*const f32; 4],
    n: usize,
    out: &mut [[f32; 4]; 4],
) {
    for c0 in (0..4).step_by(C) {
        let mut acc = [[L::zero(); C]; 4];
        let mut i = 0;
        while i + L::N <= n {
            dot4x4_step::<L, C>(w, x, c0, i, L::N, &mut acc);
            i += L::N;
        }
        if PART && i < n {
            dot4x4_step::<L, C>(w, x, c0, i, n - i, &mut acc);
            i = n;
        }
        for (r, a) in acc.iter().enumerate() {
            for (c, &ac) in a.iter().enumerate() {
                let mut s = L::reduce(ac);
                for k in i..n {
                    s += *w[r].add(k) * *x[c0 + c].add(k);
                }
                out[r][c0 + c] = s;
            }
        }
    }
}

/// One step of [`dot4x4`] over elements `i..i + k` (`k ≤ N`, zero-padded).
#[inline(always)]
unsafe fn dot4x4_step<L: F32Lanes, const C: usize>(
    w: &[*const f32; 4],
    x: &[*const f32; 4],
    c0: usize,
    i: usize,
    k: usize,
    acc: &mut [[L::V; C]; 4],
) {
    let ld = |p: *const f32| if k == L::N { L::load(p) } else { L::load_part(p, k) };
    let mut xv = [L::zero(); C];
    for (c, v) in xv.iter_mut().enumerate() {
        *v = ld(x[c0 + c].add(i));
    }
    for (r, a) in acc.iter_mut().enumerate() {
        let wv = ld(w[r].add(i));
        for (ac, &xc) in a.iter_mut().zip(&xv) {
            *ac = L::fma(wv, xc, *ac);
        }
    }
}

/// Packed-panel GEMM block: two vectors of weight rows (`2·N` rows from
/// `w`, panel stride `GEMM_MR`) × `NT` tokens (from `x`, stride `GEMM_NR`),
/// written to `out[j0 + j][col..col + 2·N]`.
#[inline(always)]
pub(crate) unsafe fn gemm_block<L: F32Lanes, const NT: usize>(
    w: *const f32,
    x: *const f32,
    cols: usize,
    col: usize,
    j0: usize,
    out: &mut [[f32; crate::dot::set::GEMM_MR]; crate::dot::set::GEMM_NR],
) {
    let mut acc = [[L::zero(); 2]; NT];
    for k in 0..cols {
        let wp = w.add(k * crate::dot::set::GEMM_MR);
        let (w0, w1) = (L::load(wp), L::load(wp.add(L::N)));
        let xp = x.add(k * crate::dot::set::GEMM_NR);
        for (j, a) in acc.iter_mut().enumerate() {
            let b = L::splat(*xp.add(j));
            a[0] = L::fma(w0, b, a[0]);
            a[1] = L::fma(w1, b, a[1]);
        }
    }
    for (j, a) in acc.iter().enumerate() {
        let o = out[j0 + j].as_mut_ptr().add(col);
        L::store(o, a[0]);
        L::store(o.add(L::N), a[1]);
    }
}

// ---- KV cache rows: group dot / axpy on coded rows -----------------------

/// Storage kinds of the KV group kernels (const-generic selector).
pub(crate) const KV_F16: u8 = 0;
pub(crate) const KV_Q8: u8 = 1;
pub(crate) const KV_Q4: u8 = 2;

/// Element `j` of a coded row as f32 (tails shorter than a vector).
///
/// # Safety
/// `j` must lie in the row; `data`/`scales` must hold the whole row.
#[inline]
pub(crate) unsafe fn kv_elem<const T: u8>(data: *const u8, scales: *const f32, j: usize) -> f32 {
    unsafe {
        match T {
            KV_F16 => crate::f16::f16_to_f32(u16::from_le(std::ptr::read_unaligned(data.add(2 * j).cast::<u16>()))),
            KV_Q8 => (*data.add(j) as i8 as f32) * *scales.add(j / crate::kvquant::format::KV_GROUP),
            _ => {
                let b = *data.add(j / 2);
                let c = if j & 1 == 0 { b & 0x0f } else { b >> 4 };
                let g = j / crate::kvquant::format::KV_GROUP;
                *scales.add(2 * g + 1) + *scales.add(2 * g) * c as f32
            }
        }
    }
}

/// Coded KV rows (f16, q8, q4) widened `N` at a time: f16 through
/// [`HalfLanes`], the integer codes through these.
pub(crate) trait KvLanes: HalfLanes {
    /// `N` signed bytes at `p` as f32.
    unsafe fn i8s(p: *const u8) -> Self::V;
    /// The `N` nibbles of the `N / 2` bytes at `p` as f32, element order
    /// (the low nibble of a byte first).
    unsafe fn nibbles(p: *const u8) -> Self::V;
}

/// Elements `i..i + N` of a coded row as f32 (`i` a multiple of `N`, so
/// the `N` share one scale group): exactly [`kv_elem`] lane by lane.
///
/// # Safety
/// `i + N` must not exceed the row's length.
#[inline(always)]
pub(crate) unsafe fn kv_load<L: KvLanes, const T: u8>(data: *const u8, scales: *const f32, i: usize) -> L::V {
    let g = i / crate::kvquant::format::KV_GROUP;
    match T {
        KV_F16 => L::half::<false>(data.add(2 * i).cast()),
        KV_Q8 => L::mul(L::i8s(data.add(i)), L::splat(*scales.add(g))),
        _ => L::fma(L::nibbles(data.add(i / 2)), L::splat(*scales.add(2 * g)), L::splat(*scales.add(2 * g + 1))),
    }
}

/// `out[h] = q_h · row` for `N` heads (`q_h` at `q + h·d`); the tail
/// (`d % L::N`) through the scalar element decode.
#[inline(always)]
pub(crate) unsafe fn kv_dot<L: KvLanes, const T: u8, const H: usize>((data, scales, q, d, out): KvRowArgs) {
    let mut acc = [L::zero(); H];
    let full = d / L::N * L::N;
    let mut i = 0;
    while i < full {
        let k = kv_load::<L, T>(data, scales, i);
        for (h, a) in acc.iter_mut().enumerate() {
            *a = L::fma(k, L::load(q.add(h * d + i)), *a);
        }
        i += L::N;
    }
    for (h, a) in acc.iter().enumerate() {
        let mut s = L::reduce(*a);
        for j in full..d {
            s += kv_elem::<T>(data, scales, j) * *q.add(h * d + j);
        }
        *out.add(h) = s;
    }
}

/// `out_h += p[h] · row` for `H` heads (`out_h` at `out + h·d`).
#[inline(always)]
pub(crate) unsafe fn kv_axpy<L: KvLanes, const T: u8, const H: usize>((data, scales, p, d, out): KvRowArgs) {
    let mut pv = [L::zero(); H];
    for (h, v) in pv.iter_mut().enumerate() {
        *v = L::splat(*p.add(h));
    }
    let full = d / L::N * L::N;
    let mut i = 0;
    while i < full {
        let v = kv_load::<L, T>(data, scales, i);
        for (h, &a) in pv.iter().enumerate() {
            let o = out.add(h * d + i);
            L::store(o, L::fma(a, v, L::load(o)));
        }
        i += L::N;
    }
    for j in full..d {
        let v = kv_elem::<T>(data, scales, j);
        for h in 0..H {
            *out.add(h * d + j) += *p.add(h) * v;
        }
    }
}

/// An ISA's `#[target_feature]` entry point for the KV group kernels: an
/// instantiation of [`kv_dot`] (`DOT`) or [`kv_axpy`].
pub(crate) trait KvIsa {
    unsafe fn row<const T: u8, const H: usize, const DOT: bool>(args: KvRowArgs);
}

/// `(codes, scales, a, d, o)` of [`kv_dot`] / [`kv_axpy`].
pub(crate) type KvRowArgs = (*const u8, *const f32, *const f32, usize, *mut f32);

/// Implements [`KvIsa`] for `$isa` with the target features `$features`.
#[cfg(target_arch = "x86_64")]
macro_rules! kv_isa {
    ($isa:ty, $features:literal) => {
        impl $crate::simd::lanes::KvIsa for $isa {
            #[target_feature(enable = $features)]
            unsafe fn row<const T: u8, const H: usize, const DOT: bool>(args: $crate::simd::lanes::KvRowArgs) {
                if DOT {
                    $crate::simd::lanes::kv_dot::<$isa, T, H>(args)
                } else {
                    $crate::simd::lanes::kv_axpy::<$isa, T, H>(args)
                }
            }
        }
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use kv_isa;
