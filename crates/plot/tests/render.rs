//! End-to-end checks of both renderings: the PNG is decoded back (chunks,
//! CRCs, deflate blocks, Adler-32, row filters) and the SVG is
//! checked for balanced tags and its series names.

use kvslim_plot::png::{adler32, crc32, zlib_fixed, zlib_stored, SIGNATURE};
use kvslim_plot::Chart;

fn sample() -> Chart {
    Chart::new("Accuracy vs KV budget")
        .x_label("budget (% of prompt)")
        .y_label("acc_norm")
        .log_x(true)
        .size(640, 400)
        .series("h2o <heavy&recent>", vec![(5.0, 0.41), (10.0, 0.47), (20.0, 0.52), (40.0, 0.55), (100.0, 0.56)])
        .series("window", vec![(5.0, 0.30), (10.0, 0.35), (20.0, 0.44), (40.0, 0.51), (100.0, 0.56)])
        .series("full", vec![(5.0, 0.56), (100.0, 0.56), (f64::NAN, 1.0), (-1.0, 0.2)])
}

/// LSB-first bit reader over a deflate stream.
struct Bits<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Bits<'_> {
    fn bit(&mut self) -> u32 {
        let b = (self.data[self.pos / 8] >> (self.pos % 8)) & 1;
        self.pos += 1;
        b as u32
    }
    fn bits(&mut self, n: u32) -> u32 {
        (0..n).fold(0, |acc, i| acc | (self.bit() << i))
    }
    /// A Huffman code of `n` bits, most significant first.
    fn code(&mut self, n: u32) -> u32 {
        (0..n).fold(0, |acc, _| (acc << 1) | self.bit())
    }
}

/// Inflates a zlib stream of stored and fixed-Huffman blocks (what the
/// encoder writes), checking header and Adler-32.
fn inflate(z: &[u8]) -> Vec<u8> {
    const LB: [usize; 29] = [
        3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227,
        258,
    ];
    const LE: [u32; 29] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
    const DB: [usize; 30] = [
        1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097,
        6145, 8193, 12289, 16385, 24577,
    ];
    assert_eq!((z[0] as u32 * 256 + z[1] as u32) % 31, 0);
    assert_eq!(z[0] & 0x0f, 8, "deflate");
    let mut r = Bits { data: &z[..z.len() - 4], pos: 16 };
    let mut out: Vec<u8> = Vec::new();
    loop {
        let last = r.bit();
        match r.bits(2) {
            0 => {
                r.pos = r.pos.div_ceil(8) * 8;
                let p = r.pos / 8;
                let len = u16::from_le_bytes([r.data[p], r.data[p + 1]]);
                assert_eq!(len, !u16::from_le_bytes([r.data[p + 2], r.data[p + 3]]));
                out.extend_from_slice(&r.data[p + 4..p + 4 + len as usize]);
                r.pos = (p + 4 + len as usize) * 8;
            }
            1 => loop {
                let mut c = r.code(7);
                let sym = if c <= 23 {
                    256 + c
                } else {
                    c = (c << 1) | r.bit();
                    if (0x30..=0xbf).contains(&c) {
                        c - 0x30
                    } else if (0xc0..=0xc7).contains(&c) {
                        280 + c - 0xc0
                    } else {
                        c = (c << 1) | r.bit();
                        assert!((0x190..=0x1ff).contains(&c));
                        144 + c - 0x190
                    }
                };
                match sym {
                    0..=255 => out.push(sym as u8),
                    256 => break,
                    _ => {
                        let li = (sym - 257) as usize;
                        let len = LB[li] + r.bits(LE[li]) as usize;
                        let di = r.code(5) as usize;
                        let extra = if di < 4 { 0 } else { (di as u32 - 2) / 2 };
                        let dist = DB[di] + r.bits(extra) as usize;
                        assert!(dist <= out.len() && dist <= 32768, "distance {dist} at {}", out.len());
                        for _ in 0..len {
                            out.push(out[out.len() - dist]);
                        }
                    }
                }
            },
            t => panic!("block type {t} is not written by the encoder"),
        }
        if last == 1 {
            break;
        }
    }
    assert!(r.pos.div_ceil(8) <= r.data.len(), "stream overrun");
    assert_eq!(u32::from_be_bytes(z[z.len() - 4..].try_into().unwrap()), adler32(&out));
    out
}

#[test]
fn deflate_round_trips() {
    let mut seed = 1u64;
    let mut noise = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) as u8
    };
    let random: Vec<u8> = (0..70_000).map(|_| noise()).collect();
    let runs: Vec<u8> = (0..200_000).map(|i| if (i / 3000) % 2 == 0 { 255 } else { (i % 7) as u8 }).collect();
    let text = b"abcabcabcabcabcabc hello hello hello world".repeat(500);
    for data in [vec![], vec![42u8], vec![1, 2], random, runs.clone(), text] {
        assert_eq!(inflate(&zlib_fixed(&data)), data);
        assert_eq!(inflate(&zlib_stored(&data)), data);
    }
    assert!(zlib_fixed(&runs).len() < runs.len() / 50);
}

/// Decodes what our encoder writes: returns (width, height, RGB pixels).
fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
    assert_eq!(&bytes[..8], &SIGNATURE);
    let mut pos = 8;
    let (mut w, mut h) = (0u32, 0u32);
    let mut idat = Vec::new();
    let mut kinds = Vec::new();
    while pos < bytes.len() {
        let len = u32::from_be_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        let kind = &bytes[pos + 4..pos + 8];
        let data = &bytes[pos + 8..pos + 8 + len];
        let crc = u32::from_be_bytes(bytes[pos + 8 + len..pos + 12 + len].try_into().unwrap());
        assert_eq!(crc32(crc32(0, kind), data), crc, "CRC of {}", String::from_utf8_lossy(kind));
        kinds.push(String::from_utf8_lossy(kind).to_string());
        match kind {
            b"IHDR" => {
                w = u32::from_be_bytes(data[0..4].try_into().unwrap());
                h = u32::from_be_bytes(data[4..8].try_into().unwrap());
                assert_eq!(&data[8..], &[8, 2, 0, 0, 0]);
            }
            b"IDAT" => idat.extend_from_slice(data),
            _ => {}
        }
        pos += 12 + len;
    }
    assert_eq!(kinds.first().map(String::as_str), Some("IHDR"));
    assert_eq!(kinds.last().map(String::as_str), Some("IEND"));
    let raw = inflate(&idat);
    let stride = w as usize * 3;
    assert_eq!(raw.len(), (stride + 1) * h as usize);
    let mut px = Vec::with_capacity(stride * h as usize);
    for row in raw.chunks_exact(stride + 1) {
        assert_eq!(row[0], 0, "filter type none");
        px.extend_from_slice(&row[1..]);
    }
    (w, h, px)
}

#[test]
fn png_decodes_to_the_requested_size_with_ink_in_series_colours() {
    let chart = sample();
    let png = chart.to_png();
    assert!(png.len() < 640 * 400 * 3 / 10, "compressed: {} bytes", png.len());
    let (w, h, px) = decode_png(&png);
    assert_eq!((w, h), (640, 400));
    let count = |c: [u8; 3]| px.chunks_exact(3).filter(|p| *p == c).count();
    // white background dominates, but lines, text and markers are drawn
    assert!(count([255, 255, 255]) > px.len() / 3 / 2);
    assert!(count([0x1f, 0x77, 0xb4]) > 50, "first series colour");
    assert!(count([0xff, 0x7f, 0x0e]) > 50, "second series colour");
    assert!(count([0, 0, 0]) > 100, "title and labels");
}

#[test]
fn svg_is_balanced_and_names_every_series() {
    let svg = sample().to_svg();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    for name in ["h2o &lt;heavy&amp;recent&gt;", "window", "full", "Accuracy vs KV budget", "acc_norm"] {
        assert!(svg.contains(&format!(">{name}</text>")), "{name}");
    }
    assert!(!svg.contains("NaN") && !svg.contains("inf"));
    // tags balance: every <x …> is closed by </x> or self-closed
    let mut stack: Vec<String> = Vec::new();
    let mut rest = svg.as_str();
    while let Some(i) = rest.find('<') {
        let j = rest[i..].find('>').expect("unterminated tag") + i;
        let tag = &rest[i + 1..j];
        assert!(!tag.contains('<'), "{tag}");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name));
        } else if !tag.ends_with('/') {
            stack.push(tag.split_whitespace().next().unwrap().to_string());
        }
        // text content holds no raw ampersands
        let text_end = rest[j..].find('<').map_or(rest.len(), |k| k + j);
        for (k, _) in rest[j + 1..text_end].match_indices('&') {
            let ent = &rest[j + 1 + k..text_end];
            assert!(["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].iter().any(|e| ent.starts_with(e)), "{ent}");
        }
        rest = &rest[j + 1..];
    }
    assert!(stack.is_empty(), "{stack:?}");
    assert_eq!(svg.matches("<polyline").count(), 3);
}

#[test]
fn save_picks_the_format_from_the_extension() {
    let dir = std::env::temp_dir().join(format!("kvslim-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let chart = sample();
    chart.save(&dir.join("c.png")).unwrap();
    chart.save(&dir.join("c.svg")).unwrap();
    assert!(std::fs::read(dir.join("c.png")).unwrap().starts_with(&SIGNATURE));
    assert!(std::fs::read_to_string(dir.join("c.svg")).unwrap().starts_with("<svg"));
    assert!(chart.save(&dir.join("c.jpg")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
