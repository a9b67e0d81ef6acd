//! What a coded KV row is: its storage type and sizes. Kept apart from
//! the codecs so the SIMD group kernels (`crate::simd`) can check a row
//! without depending on the codecs' dispatch.

use std::fmt;
use std::str::FromStr;

/// How cached K/V rows are stored.
///
/// Chosen once per cache; trades memory (and bandwidth in attention) for
/// accuracy. `F32` is the default because it is exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// 4 bytes per element, exact.
    #[default]
    F32,
    /// 2 bytes per element, IEEE half precision.
    F16,
    /// 1 byte per element plus one f32 scale per group of [`KV_GROUP`].
    Q8,
    /// Half a byte per element plus an f32 scale and min per group of [`KV_GROUP`].
    Q4,
}

/// Elements per scale group for Q8 and Q4.
///
/// Small enough that one outlier only coarsens 32 neighbours, large enough
/// that the f32 side values cost little (1/8 of a Q8 row's code bytes).
pub const KV_GROUP: usize = 32;

/// Rounds a byte count up to a multiple of 4 so packed rows stay f32-aligned.
#[inline]
fn round4(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// Number of scale groups in a row of `d` elements.
#[inline]
fn groups(d: usize) -> usize {
    d.div_ceil(KV_GROUP)
}

impl KvDtype {
    /// Every dtype, for CLI help and exhaustive tests.
    pub const ALL: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Q8, KvDtype::Q4];

    /// Short lowercase name, as accepted by [`FromStr`] and shown to users.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Q8 => "q8",
            KvDtype::Q4 => "q4",
        }
    }

    /// Bytes of codes for a row of `d` elements (F32 `4d`, F16 `2d`, Q8 `d`,
    /// Q4 `ceil(d/2)`), rounded up to a multiple of 4 so rows packed back to
    /// back in a u32/f32-aligned buffer stay 4-byte aligned.
    pub fn data_bytes(self, d: usize) -> usize {
        match self {
            KvDtype::F32 => 4 * d,
            KvDtype::F16 => round4(2 * d),
            KvDtype::Q8 => round4(d),
            KvDtype::Q4 => round4(d.div_ceil(2)),
        }
    }

    /// f32 side values per row, which must travel with the row's data: none
    /// for F32/F16, one scale per group for Q8, scale and min per group
    /// (`[s0, m0, s1, m1, ...]`) for Q4.
    pub fn scale_count(self, d: usize) -> usize {
        match self {
            KvDtype::F32 | KvDtype::F16 => 0,
            KvDtype::Q8 => groups(d),
            KvDtype::Q4 => 2 * groups(d),
        }
    }

    /// Bytes one stored row takes: its codes and its f32 side values.
    pub fn row_bytes(self, d: usize) -> usize {
        self.data_bytes(d) + 4 * self.scale_count(d)
    }
}

impl FromStr for KvDtype {
    type Err = String;

    /// Parses `f32`, `f16`, `q8` or `q4` (ASCII case-insensitive, surrounding
    /// whitespace ignored) so CLI flags and config files can name a dtype.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        KvDtype::ALL.into_iter().find(|k| k.name().eq_ignore_ascii_case(t)).ok_or_else(|| {
            let names: Vec<&str> = KvDtype::ALL.iter().map(|k| k.name()).collect();
            format!("unknown KV cache dtype '{s}': expected one of {}", names.join(", "))
        })
    }
}

impl fmt::Display for KvDtype {
    /// Writes [`KvDtype::name`], so `to_string` round-trips through `FromStr`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
