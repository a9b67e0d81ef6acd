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

/// Builds an `$n`-lane array from `|$i| expr`.
macro_rules! lanes {
    ($n:expr, |$i:ident| $e:expr) => {
        std::array::from_fn::<_, $n, _>(|$i| $e)
    };
}

pub fn vdupq_n_f32(v: f32) -> float32x4_t {
    float32x4_t([v; 4])
}
pub fn vdupq_n_u32(v: u32) -> uint32x4_t {
    uint32x4_t([v; 4])
}
pub fn vdupq_n_u8(v: u8) -> uint8x16_t {
    uint8x16_t([v; 16])
}
pub fn vdupq_n_s8(v: i8) -> int8x16_t {
    int8x16_t([v; 16])
}
pub unsafe fn vld1q_f32(p: *const f32) -> float32x4_t {
    float32x4_t(lanes!(4, |i| *p.add(i)))
}
pub unsafe fn vst1q_f32(p: *mut f32, a: float32x4_t) {
    for (i, v) in a.0.iter().enumerate() {
        *p.add(i) = *v;
    }
}
pub unsafe fn vld1q_u16(p: *const u16) -> uint16x8_t {
    uint16x8_t(lanes!(8, |i| *p.add(i)))
}
pub unsafe fn vld1q_u8(p: *const u8) -> uint8x16_t {
    uint8x16_t(lanes!(16, |i| *p.add(i)))
}
pub unsafe fn vld1q_s8(p: *const i8) -> int8x16_t {
    int8x16_t(lanes!(16, |i| *p.add(i)))
}
/// a + b·c, fused.
pub fn vfmaq_f32(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
    float32x4_t(lanes!(4, |i| b.0[i].mul_add(c.0[i], a.0[i])))
}
/// a + b·c with a scalar c, fused.
pub fn vfmaq_n_f32(a: float32x4_t, b: float32x4_t, c: f32) -> float32x4_t {
    float32x4_t(lanes!(4, |i| b.0[i].mul_add(c, a.0[i])))
}
pub fn vmulq_f32(a: float32x4_t, b: float32x4_t) -> float32x4_t {
    float32x4_t(lanes!(4, |i| a.0[i] * b.0[i]))
}
pub fn vmulq_n_f32(a: float32x4_t, b: f32) -> float32x4_t {
    float32x4_t(lanes!(4, |i| a.0[i] * b))
}
pub fn vaddq_f32(a: float32x4_t, b: float32x4_t) -> float32x4_t {
    float32x4_t(lanes!(4, |i| a.0[i] + b.0[i]))
}
pub fn vaddvq_f32(a: float32x4_t) -> f32 {
    (a.0[0] + a.0[1]) + (a.0[2] + a.0[3])
}
pub fn vandq_u32(a: uint32x4_t, b: uint32x4_t) -> uint32x4_t {
    uint32x4_t(lanes!(4, |i| a.0[i] & b.0[i]))
}
pub fn vorrq_u32(a: uint32x4_t, b: uint32x4_t) -> uint32x4_t {
    uint32x4_t(lanes!(4, |i| a.0[i] | b.0[i]))
}
pub fn vcgeq_u32(a: uint32x4_t, b: uint32x4_t) -> uint32x4_t {
    uint32x4_t(lanes!(4, |i| if a.0[i] >= b.0[i] { u32::MAX } else { 0 }))
}
/// Bitwise select: bits of `b` where `m` is set, else bits of `c`.
pub fn vbslq_u32(m: uint32x4_t, b: uint32x4_t, c: uint32x4_t) -> uint32x4_t {
    uint32x4_t(lanes!(4, |i| (m.0[i] & b.0[i]) | (!m.0[i] & c.0[i])))
}
pub fn vshlq_n_u32<const N: i32>(a: uint32x4_t) -> uint32x4_t {
    uint32x4_t(lanes!(4, |i| a.0[i] << N))
}
pub fn vshrq_n_u8<const N: i32>(a: uint8x16_t) -> uint8x16_t {
    uint8x16_t(lanes!(16, |i| a.0[i] >> N))
}
pub fn vreinterpretq_f32_u32(a: uint32x4_t) -> float32x4_t {
    float32x4_t(lanes!(4, |i| f32::from_bits(a.0[i])))
}
pub fn vreinterpretq_u32_f32(a: float32x4_t) -> uint32x4_t {
    uint32x4_t(lanes!(4, |i| a.0[i].to_bits()))
}
pub fn vreinterpretq_s8_u8(a: uint8x16_t) -> int8x16_t {
    int8x16_t(lanes!(16, |i| a.0[i] as i8))
}
pub fn vget_low_u16(a: uint16x8_t) -> uint16x4_t {
    uint16x4_t(lanes!(4, |i| a.0[i]))
}
pub fn vget_low_u8(a: uint8x16_t) -> uint8x8_t {
    uint8x8_t(lanes!(8, |i| a.0[i]))
}
pub fn vget_low_s8(a: int8x16_t) -> int8x8_t {
    int8x8_t(lanes!(8, |i| a.0[i]))
}
pub fn vget_low_s16(a: int16x8_t) -> int16x4_t {
    int16x4_t(lanes!(4, |i| a.0[i]))
}
pub fn vmovl_u16(a: uint16x4_t) -> uint32x4_t {
    uint32x4_t(lanes!(4, |i| a.0[i] as u32))
}
pub fn vmovl_high_u16(a: uint16x8_t) -> uint32x4_t {
    uint32x4_t(lanes!(4, |i| a.0[i + 4] as u32))
}
pub fn vmovl_u8(a: uint8x8_t) -> uint16x8_t {
    uint16x8_t(lanes!(8, |i| a.0[i] as u16))
}
pub fn vmovl_high_u8(a: uint8x16_t) -> uint16x8_t {
    uint16x8_t(lanes!(8, |i| a.0[i + 8] as u16))
}
pub fn vmovl_s8(a: int8x8_t) -> int16x8_t {
    int16x8_t(lanes!(8, |i| a.0[i] as i16))
}
pub fn vmovl_high_s8(a: int8x16_t) -> int16x8_t {
    int16x8_t(lanes!(8, |i| a.0[i + 8] as i16))
}
pub fn vmovl_s16(a: int16x4_t) -> int32x4_t {
    int32x4_t(lanes!(4, |i| a.0[i] as i32))
}
pub fn vmovl_high_s16(a: int16x8_t) -> int32x4_t {
    int32x4_t(lanes!(4, |i| a.0[i + 4] as i32))
}
pub fn vcvtq_f32_s32(a: int32x4_t) -> float32x4_t {
    float32x4_t(lanes!(4, |i| a.0[i] as f32))
}
pub fn vcvtq_f32_u32(a: uint32x4_t) -> float32x4_t {
    float32x4_t(lanes!(4, |i| a.0[i] as f32))
}
pub fn vandq_u8(a: uint8x16_t, b: uint8x16_t) -> uint8x16_t {
    uint8x16_t(lanes!(16, |i| a.0[i] & b.0[i]))
}
pub fn vsubq_s8(a: int8x16_t, b: int8x16_t) -> int8x16_t {
    int8x16_t(lanes!(16, |i| a.0[i].wrapping_sub(b.0[i])))
}
pub fn vorrq_u8(a: uint8x16_t, b: uint8x16_t) -> uint8x16_t {
    uint8x16_t(lanes!(16, |i| a.0[i] | b.0[i]))
}
/// All ones where `a & b` is nonzero, else zero.
pub fn vtstq_u8(a: uint8x16_t, b: uint8x16_t) -> uint8x16_t {
    uint8x16_t(lanes!(16, |i| if a.0[i] & b.0[i] != 0 { u8::MAX } else { 0 }))
}
/// Shift left; bits shifted out of a lane are lost.
pub fn vshlq_n_u8<const N: i32>(a: uint8x16_t) -> uint8x16_t {
    uint8x16_t(lanes!(16, |i| a.0[i] << N))
}
pub fn vdup_n_u8(v: u8) -> uint8x8_t {
    uint8x8_t([v; 8])
}
/// `low` in lanes 0..8, `high` in lanes 8..16.
pub fn vcombine_u8(low: uint8x8_t, high: uint8x8_t) -> uint8x16_t {
    uint8x16_t(lanes!(16, |i| if i < 8 { low.0[i] } else { high.0[i - 8] }))
}
