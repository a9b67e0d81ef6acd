//! Half-precision conversions (IEEE binary16 and bfloat16), exact and
//! branch-light, so no external crate is needed.

/// Converts an IEEE 754 binary16 bit pattern to f32 exactly.
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if mant == 0 {
            sign
        } else {
            // subnormal: value = mant * 2^-24
            let v = mant as f32 * f32::from_bits(0x3380_0000); // 2^-24
            return if sign != 0 { -v } else { v };
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (mant << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (mant << 13)
    };
    f32::from_bits(bits)
}

/// Converts f32 to binary16 with round-to-nearest-even.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let mut r = m >> shift;
        let rem = m & ((1 << shift) - 1);
        if rem > half || (rem == half && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && (r & 1) == 1) {
        r += 1;
    }
    sign | r as u16
}

/// Converts a bfloat16 bit pattern to f32 exactly.
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Converts f32 to bfloat16 with round-to-nearest-even.
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    ((bits + round) >> 16) as u16
}

/// Converts a run of binary16 values to f32 (exact), with the F16C
/// instructions where the CPU has them (KV rows stored as f16 are decoded
/// once per attention step, so this is on the decode path).
pub fn f16_slice_to_f32(src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16 conversion needs equal lengths");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the features were just detected; lengths are equal.
        unsafe { f16c_convert(src, dst) };
        return;
    }
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(h);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn f16c_convert(src: &[u16], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = src.len() / 8 * 8;
    for i in (0..n).step_by(8) {
        // SAFETY: i + 8 ≤ n ≤ len for both slices; unaligned loads/stores.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    for i in n..src.len() {
        dst[i] = f16_to_f32(src[i]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_finite_value() {
        for h in 0u16..=0xffff {
            let x = f16_to_f32(h);
            if x.is_nan() {
                continue;
            }
            assert_eq!(f32_to_f16(x), h, "h={h:#x} x={x}");
        }
    }

    #[test]
    fn f16_known_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(1e6), 0x7c00);
    }

    #[test]
    fn bf16_round_trip() {
        for x in [1.0f32, -3.5, 0.15625, 1e-20, 3e30] {
            let b = f32_to_bf16(x);
            assert!((bf16_to_f32(b) - x).abs() <= x.abs() / 128.0);
        }
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    #[test]
    fn slice_conversion_matches_scalar() {
        let src: Vec<u16> = (0..1000u32).map(|i| (i * 65).wrapping_mul(2654435761) as u16).collect();
        let mut fast = vec![0f32; src.len()];
        f16_slice_to_f32(&src, &mut fast);
        for (h, f) in src.iter().zip(&fast) {
            let s = f16_to_f32(*h);
            assert!(s.to_bits() == f.to_bits() || (s.is_nan() && f.is_nan()), "{h:#x}");
        }
    }
}
