//! Byte sizes as the command line writes them (`--kv-memory 2GiB`,
//! `--max-body-bytes 1MiB`, `--mem-limit 1.5GB`): one parser for every
//! flag of the server, the benchmark and the evaluation.
//!
//! A number, decimals allowed, then an optional unit in any case, with or
//! without a space: `B` (or none) for bytes; `KB`, `MB`, `GB`, `TB` for
//! powers of 1000 (SI); `KiB`, `MiB`, `GiB`, `TiB` for powers of 1024
//! (IEC). A bare `K`, `M`, `G` or `T` is refused as ambiguous. A fraction
//! of a byte is dropped (`1.5B` is 1), computed exactly (`1.001KB` is 1001).

/// What the errors suggest.
const HOW: &str = "like 2GiB, 512MB or 1000000: KB, MB, GB, TB count in powers of 1000, KiB, MiB, GiB, TiB in \
                   powers of 1024, B or no unit in bytes";

/// Parses a byte size (see the module's documentation for the units).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(format!("`{s}` is not a byte size {HOW}"));
    }
    let scale: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        u @ ("k" | "m" | "g" | "t") => {
            let u = u.to_ascii_uppercase();
            return Err(format!(
                "`{s}`: the unit `{unit}` is ambiguous; write {u}B (powers of 1000) or {u}iB (of 1024)"
            ));
        }
        _ => return Err(format!("`{s}`: unknown unit `{unit}`; write a size {HOW}")),
    };
    let too_large = || format!("`{s}` is larger than this machine can address");
    // digits as exact integers: the whole part times the unit, plus the
    // fraction's first 18 digits times the unit over their power of ten
    let int: u128 = if int.is_empty() { 0 } else { int.parse().map_err(|_| too_large())? };
    let frac = &frac[..frac.len().min(18)];
    let frac_bytes =
        if frac.is_empty() { 0 } else { frac.parse::<u128>().unwrap() * scale / 10u128.pow(frac.len() as u32) };
    let bytes = int.checked_mul(scale).and_then(|b| b.checked_add(frac_bytes)).ok_or_else(too_large)?;
    usize::try_from(bytes).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn units_in_either_spelling() {
        for (s, want) in [
            ("1000", 1000),
            ("1000B", 1000),
            ("1000 b", 1000),
            ("0", 0),
            ("2KB", 2000),
            ("2kb", 2000),
            ("2 KB", 2000),
            ("1GB", 1_000_000_000),
            ("1.5GB", 1_500_000_000),
            ("3MB", 3_000_000),
            ("1TB", 1_000_000_000_000),
            ("2KiB", 2048),
            ("2kib", 2048),
            ("1.5KiB", 1536),
            (".5KiB", 512),
            ("64KiB", 64 << 10),
            ("512MiB", 512 << 20),
            ("2GiB", 2 << 30),
            (" 2 GiB ", 2 << 30),
            ("1TiB", 1 << 40),
            // exact decimals, fractions of a byte dropped
            ("1.001KB", 1001),
            ("1.5B", 1),
            ("0.0000000000000000001TiB", 0),
        ] {
            assert_eq!(parse_bytes(s), Ok(want), "{s:?}");
        }
    }

    #[test]
    fn bad_sizes_say_what_is_wrong() {
        let cases = [
            ("", "is not a byte size like 2GiB"),
            ("lots", "is not a byte size like 2GiB"),
            ("-1", "is not a byte size"),
            ("1.2.3", "is not a byte size"),
            (".", "is not a byte size"),
            ("GiB", "is not a byte size"),
            ("2G", "the unit `G` is ambiguous; write GB (powers of 1000) or GiB (of 1024)"),
            ("2k", "the unit `k` is ambiguous; write KB"),
            ("3XB", "unknown unit `XB`"),
            ("2 parsecs", "unknown unit `parsecs`"),
            ("1e9", "unknown unit `e9`"),
            ("99999999999999999999999TiB", "larger than this machine can address"),
            ("999999999999999999999999999999999999999999", "larger than this machine can address"),
        ];
        crate::testing::assert_refused(parse_bytes, &cases);
    }
}
