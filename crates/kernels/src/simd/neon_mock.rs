//! Scalar stand-ins for the NEON intrinsics used by `neon.rs`, with the same
//! names and signatures, so the NEON kernels run (slowly) in x86 tests.
//! Each follows the Arm definition lane by lane.

#![allow(non_camel_case_types)]

macro_rules! vector {
    ($($name:ident: [$t:ty; $n:expr]),* $(,)?) => {$(
        #[derive(Clone, Copy)]
        pub struct $name(pub [$t; $n]);
    )*};
}
vector!(
    float32x4_t: [f32; 4],
    uint32x4_t: [u32; 4],
    int32x4_t: [i32; 4],
    uint16x8_t: [u16; 8],
    uint16x4_t: [u16; 4],
    int16x8_t: [i16; 8],
    int16x4_t: [i16; 4],
    uint8x16_t: [u8; 16],
    uint8x8_t: [u8; 8],
    int8x16_t: [i8; 16],
    int8x8_t: [i8; 8],
);

/// Lane-wise stand-ins: `name(args) -> Vector[lanes] = |i| lane i`, with
/// `<N>` for an immediate shift count.
macro_rules! lanewise {
    ($($(#[$doc:meta])* $name:ident $(<$c:ident>)? ($($arg:ident: $t:ty),*) -> $out:ident[$n:expr] = |$i:ident| $e:expr;)*) => {$(
        $(#[$doc])*
        pub fn $name $(<const $c: i32>)? ($($arg: $t),*) -> $out {
            $out(std::array::from_fn::<_, { $n }, _>(|$i| $e))
        }
    )*};
}

/// Loads of a whole vector from `p`.
macro_rules! loads {
    ($($name:ident(*const $t:ty) -> $out:ident[$n:expr];)*) => {$(
        pub unsafe fn $name(p: *const $t) -> $out {
            $out(std::array::from_fn::<_, $n, _>(|i| *p.add(i)))
        }
    )*};
}

loads! {
    vld1q_f32(*const f32) -> float32x4_t[4];
    vld1_u16(*const u16) -> uint16x4_t[4];
    vld1q_u8(*const u8) -> uint8x16_t[16];
    vld1q_s8(*const i8) -> int8x16_t[16];
}

pub unsafe fn vst1q_f32(p: *mut f32, a: float32x4_t) {
    for (i, v) in a.0.iter().enumerate() {
        *p.add(i) = *v;
    }
}

pub fn vaddvq_f32(a: float32x4_t) -> f32 {
    (a.0[0] + a.0[1]) + (a.0[2] + a.0[3])
}

lanewise! {
    vdupq_n_f32(v: f32) -> float32x4_t[4] = |_i| v;
    vdupq_n_u32(v: u32) -> uint32x4_t[4] = |_i| v;
    vdupq_n_u8(v: u8) -> uint8x16_t[16] = |_i| v;
    vdupq_n_s8(v: i8) -> int8x16_t[16] = |_i| v;
    vdup_n_u8(v: u8) -> uint8x8_t[8] = |_i| v;
    /// a + b·c, fused.
    vfmaq_f32(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t[4] = |i| b.0[i].mul_add(c.0[i], a.0[i]);
    /// a + b·c with a scalar c, fused.
    vfmaq_n_f32(a: float32x4_t, b: float32x4_t, c: f32) -> float32x4_t[4] = |i| b.0[i].mul_add(c, a.0[i]);
    vmulq_f32(a: float32x4_t, b: float32x4_t) -> float32x4_t[4] = |i| a.0[i] * b.0[i];
    vmulq_n_f32(a: float32x4_t, b: f32) -> float32x4_t[4] = |i| a.0[i] * b;
    vaddq_f32(a: float32x4_t, b: float32x4_t) -> float32x4_t[4] = |i| a.0[i] + b.0[i];
    vsubq_s8(a: int8x16_t, b: int8x16_t) -> int8x16_t[16] = |i| a.0[i].wrapping_sub(b.0[i]);
    vandq_u32(a: uint32x4_t, b: uint32x4_t) -> uint32x4_t[4] = |i| a.0[i] & b.0[i];
    vorrq_u32(a: uint32x4_t, b: uint32x4_t) -> uint32x4_t[4] = |i| a.0[i] | b.0[i];
    vandq_u8(a: uint8x16_t, b: uint8x16_t) -> uint8x16_t[16] = |i| a.0[i] & b.0[i];
    vorrq_u8(a: uint8x16_t, b: uint8x16_t) -> uint8x16_t[16] = |i| a.0[i] | b.0[i];
    vcgeq_u32(a: uint32x4_t, b: uint32x4_t) -> uint32x4_t[4] = |i| if a.0[i] >= b.0[i] { u32::MAX } else { 0 };
    /// All ones where `a & b` is nonzero, else zero.
    vtstq_u8(a: uint8x16_t, b: uint8x16_t) -> uint8x16_t[16] = |i| if a.0[i] & b.0[i] != 0 { u8::MAX } else { 0 };
    /// Bitwise select: bits of `b` where `m` is set, else bits of `c`.
    vbslq_u32(m: uint32x4_t, b: uint32x4_t, c: uint32x4_t) -> uint32x4_t[4] = |i| (m.0[i] & b.0[i]) | (!m.0[i] & c.0[i]);
    /// Shift left; bits shifted out of a lane are lost.
    vshlq_n_u32<N>(a: uint32x4_t) -> uint32x4_t[4] = |i| a.0[i] << N;
    vshlq_n_u8<N>(a: uint8x16_t) -> uint8x16_t[16] = |i| a.0[i] << N;
    vshrq_n_u8<N>(a: uint8x16_t) -> uint8x16_t[16] = |i| a.0[i] >> N;
    vreinterpretq_f32_u32(a: uint32x4_t) -> float32x4_t[4] = |i| f32::from_bits(a.0[i]);
    vreinterpretq_u32_f32(a: float32x4_t) -> uint32x4_t[4] = |i| a.0[i].to_bits();
    vreinterpretq_s8_u8(a: uint8x16_t) -> int8x16_t[16] = |i| a.0[i] as i8;
    /// `low` in lanes 0..8, `high` in lanes 8..16.
    vcombine_u8(low: uint8x8_t, high: uint8x8_t) -> uint8x16_t[16] = |i| if i < 8 { low.0[i] } else { high.0[i - 8] };
}

/// The low half of a vector and the widening moves of its low or high
/// half (`vmovl_high_*`: lanes from the middle on).
macro_rules! halves {
    ($($low:ident, $wide:ident, $high:ident: $t:ident[$n:expr] -> $h:ident, $w:ident as $e:ty;)*) => {$(
        lanewise! {
            $low(a: $t) -> $h[$n / 2] = |i| a.0[i];
            $wide(a: $h) -> $w[$n / 2] = |i| a.0[i] as $e;
            $high(a: $t) -> $w[$n / 2] = |i| a.0[i + $n / 2] as $e;
        }
    )*};
}

halves! {
    vget_low_u8, vmovl_u8, vmovl_high_u8: uint8x16_t[16] -> uint8x8_t, uint16x8_t as u16;
    vget_low_s8, vmovl_s8, vmovl_high_s8: int8x16_t[16] -> int8x8_t, int16x8_t as i16;
    vget_low_u16, vmovl_u16, vmovl_high_u16: uint16x8_t[8] -> uint16x4_t, uint32x4_t as u32;
    vget_low_s16, vmovl_s16, vmovl_high_s16: int16x8_t[8] -> int16x4_t, int32x4_t as i32;
}

lanewise! {
    vcvtq_f32_s32(a: int32x4_t) -> float32x4_t[4] = |i| a.0[i] as f32;
    vcvtq_f32_u32(a: uint32x4_t) -> float32x4_t[4] = |i| a.0[i] as f32;
}
