//! Line charts without dependencies: several named series of (x, y)
//! points, an optional logarithmic x axis, a title, axis labels and a
//! legend, rendered to SVG text ([`Chart::to_svg`]) or to a PNG file
//! ([`Chart::to_png`]) through an own rasterizer ([`raster`]), a 5×7 bitmap
//! font ([`font`]) and a stored-deflate PNG encoder ([`png`]).
//!
//! ```
//! use kvslim_plot::Chart;
//! let chart = Chart::new("PPL vs budget")
//!     .x_label("KV budget (%)")
//!     .y_label("perplexity")
//!     .log_x(true)
//!     .series("h2o", vec![(5.0, 9.1), (10.0, 7.2), (20.0, 6.4), (100.0, 6.1)])
//!     .series("window", vec![(5.0, 30.0), (10.0, 14.0), (20.0, 8.0), (100.0, 6.1)]);
//! let svg = chart.to_svg();
//! let png = chart.to_png();
//! assert!(svg.starts_with("<svg") && png.starts_with(&kvslim_plot::png::SIGNATURE));
//! ```
//!
//! Points whose coordinates are not finite (or x ≤ 0 on a log axis) are
//! skipped; a series' points are joined in the order given.

pub mod font;
pub mod png;
pub mod raster;

use raster::{text_size, Canvas, Rgb};
use std::fmt::Write as _;
use std::path::Path;

/// One named line.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart. Build with [`Chart::new`] and the setters, then render.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub width: u32,
    pub height: u32,
    pub series: Vec<Series>,
}

/// Series colours, in order (repeats after ten).
pub const PALETTE: [Rgb; 10] = [
    Rgb(0x1f, 0x77, 0xb4),
    Rgb(0xff, 0x7f, 0x0e),
    Rgb(0x2c, 0xa0, 0x2c),
    Rgb(0xd6, 0x27, 0x28),
    Rgb(0x94, 0x67, 0xbd),
    Rgb(0x8c, 0x56, 0x4b),
    Rgb(0xe3, 0x77, 0xc2),
    Rgb(0x7f, 0x7f, 0x7f),
    Rgb(0xbc, 0xbd, 0x22),
    Rgb(0x17, 0xbe, 0xcf),
];

const GRID: Rgb = Rgb(0xe4, 0xe4, 0xe4);
const AXIS: Rgb = Rgb(0x33, 0x33, 0x33);

impl Chart {
    /// An empty 800 × 500 chart.
    pub fn new(title: impl Into<String>) -> Self {
        Chart {
            title: title.into(),
            x_label: String::new(),
            y_label: String::new(),
            log_x: false,
            width: 800,
            height: 500,
            series: Vec::new(),
        }
    }

    pub fn x_label(mut self, label: impl Into<String>) -> Self {
        self.x_label = label.into();
        self
    }

    pub fn y_label(mut self, label: impl Into<String>) -> Self {
        self.y_label = label.into();
        self
    }

    /// Logarithmic (base 10) x axis.
    pub fn log_x(mut self, on: bool) -> Self {
        self.log_x = on;
        self
    }

    /// Image size in pixels (at least 200 × 150).
    pub fn size(mut self, width: u32, height: u32) -> Self {
        self.width = width.max(200);
        self.height = height.max(150);
        self
    }

    /// Adds a named series.
    pub fn series(mut self, name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        self.series.push(Series { name: name.into(), points });
        self
    }

    /// Writes SVG or PNG, chosen by the file extension (`.svg`, `.png`).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("svg") => std::fs::write(path, self.to_svg()),
            Some("png") => std::fs::write(path, self.to_png()),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{}: chart files must end in .svg or .png", path.display()),
            )),
        }
    }

    /// The chart as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let l = self.layout(&SVG_FONT);
        let mut s = String::new();
        let (w, h) = (self.width, self.height);
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace">"#
        );
        let _ = writeln!(s, r#"<rect x="0" y="0" width="{w}" height="{h}" fill="white"/>"#);
        let p = &l.plot;
        let tick_px = SVG_FONT.tick_scale as f64 * 7.0;
        // grid and ticks
        for t in &l.x_ticks {
            let _ = writeln!(
                s,
                r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{}" stroke-width="1"/>"#,
                p.top,
                p.bottom,
                GRID.hex(),
                x = t.pixel
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="{tick_px:.0}" text-anchor="middle" fill="{}">{}</text>"#,
                t.pixel,
                p.bottom + 6.0 + tick_px,
                AXIS.hex(),
                esc(&t.label)
            );
        }
        for t in &l.y_ticks {
            let _ = writeln!(
                s,
                r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="1"/>"#,
                p.left,
                p.right,
                GRID.hex(),
                y = t.pixel
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="{tick_px:.0}" text-anchor="end" fill="{}">{}</text>"#,
                p.left - 6.0,
                t.pixel + tick_px * 0.35,
                AXIS.hex(),
                esc(&t.label)
            );
        }
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="{}" stroke-width="1"/>"#,
            p.left,
            p.top,
            p.right - p.left,
            p.bottom - p.top,
            AXIS.hex()
        );
        // series
        for (i, (se, pts)) in self.series.iter().zip(&l.series_px).enumerate() {
            let c = PALETTE[i % PALETTE.len()].hex();
            let _ = writeln!(s, r#"<g class="series" data-name="{}">"#, esc(&se.name));
            if pts.len() > 1 {
                let d: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.2},{y:.2}")).collect();
                let _ = writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2" stroke-linejoin="round"/>"#,
                    d.join(" ")
                );
            }
            for (x, y) in pts {
                let _ = writeln!(s, r#"<circle cx="{x:.2}" cy="{y:.2}" r="3.5" fill="{c}"/>"#);
            }
            let _ = writeln!(s, "</g>");
        }
        // labels
        let title_px = l.title_scale as f64 * 7.0;
        let label_px = SVG_FONT.label_scale as f64 * 7.0;
        if !self.title.is_empty() {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="{title_px:.0}" font-weight="bold" text-anchor="middle" fill="black">{}</text>"#,
                l.title_x + l.title_w / 2.0,
                l.title_y + title_px,
                esc(&l.title)
            );
        }
        if !self.x_label.is_empty() {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="{label_px:.0}" text-anchor="middle" fill="black">{}</text>"#,
                (p.left + p.right) / 2.0,
                l.x_label_y + label_px,
                esc(&self.x_label)
            );
        }
        if !self.y_label.is_empty() {
            let (x, y) = (l.y_label_x + label_px, (p.top + p.bottom) / 2.0);
            let _ = writeln!(
                s,
                r#"<text x="{x:.1}" y="{y:.1}" font-size="{label_px:.0}" text-anchor="middle" transform="rotate(-90 {x:.1} {y:.1})" fill="black">{}</text>"#,
                esc(&self.y_label)
            );
        }
        // legend
        if let Some(lg) = &l.legend {
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="white" stroke="{}" stroke-width="1"/>"#,
                lg.x,
                lg.y,
                lg.w,
                lg.h,
                GRID.hex()
            );
            for (i, se) in self.series.iter().enumerate() {
                let c = PALETTE[i % PALETTE.len()].hex();
                let y = lg.y + LEGEND_PAD + i as f64 * lg.row + lg.row / 2.0;
                let _ = writeln!(
                    s,
                    r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{c}" stroke-width="2"/>"#,
                    lg.x + LEGEND_PAD,
                    lg.x + LEGEND_PAD + LEGEND_SWATCH
                );
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" font-size="{tick_px:.0}" fill="black">{}</text>"#,
                    lg.x + 2.0 * LEGEND_PAD + LEGEND_SWATCH,
                    y + tick_px * 0.35,
                    esc(&se.name)
                );
            }
        }
        s.push_str("</svg>\n");
        s
    }

    /// The chart as a PNG file.
    pub fn to_png(&self) -> Vec<u8> {
        let c = self.render();
        png::encode_rgb(c.width, c.height, &c.pixels)
    }

    /// The chart rasterized on a canvas.
    pub fn render(&self) -> Canvas {
        let f = &PNG_FONT;
        let l = self.layout(f);
        let p = &l.plot;
        let mut c = Canvas::new(self.width, self.height, Rgb::WHITE);
        for t in &l.x_ticks {
            c.fill_rect(t.pixel.round(), p.top, t.pixel.round() + 1.0, p.bottom, GRID);
            c.fill_rect(t.pixel.round(), p.bottom, t.pixel.round() + 1.0, p.bottom + 4.0, AXIS);
            let (tw, _) = text_size(t.label.chars().count(), f.tick_scale);
            c.text(t.pixel - tw / 2.0, p.bottom + 6.0, &t.label, f.tick_scale, AXIS);
        }
        for t in &l.y_ticks {
            c.fill_rect(p.left, t.pixel.round(), p.right, t.pixel.round() + 1.0, GRID);
            c.fill_rect(p.left - 4.0, t.pixel.round(), p.left, t.pixel.round() + 1.0, AXIS);
            let (tw, th) = text_size(t.label.chars().count(), f.tick_scale);
            c.text(p.left - 6.0 - tw, t.pixel - th / 2.0, &t.label, f.tick_scale, AXIS);
        }
        c.stroke_rect(p.left, p.top, p.right + 1.0, p.bottom + 1.0, AXIS);
        for (i, pts) in l.series_px.iter().enumerate() {
            let col = PALETTE[i % PALETTE.len()];
            for w in pts.windows(2) {
                c.line(w[0], w[1], 2.0, col);
            }
            for &(x, y) in pts {
                c.disc(x, y, 3.5, col);
            }
        }
        if !l.title.is_empty() {
            c.text(l.title_x, l.title_y, &l.title, l.title_scale, Rgb::BLACK);
        }
        if !self.x_label.is_empty() {
            let (tw, _) = text_size(self.x_label.chars().count(), f.label_scale);
            c.text((p.left + p.right - tw) / 2.0, l.x_label_y, &self.x_label, f.label_scale, Rgb::BLACK);
        }
        if !self.y_label.is_empty() {
            let (tw, _) = text_size(self.y_label.chars().count(), f.label_scale);
            c.text_up(l.y_label_x, (p.top + p.bottom + tw) / 2.0, &self.y_label, f.label_scale, Rgb::BLACK);
        }
        if let Some(lg) = &l.legend {
            c.fill_rect(lg.x, lg.y, lg.x + lg.w, lg.y + lg.h, Rgb::WHITE);
            c.stroke_rect(lg.x, lg.y, lg.x + lg.w, lg.y + lg.h, GRID);
            for (i, se) in self.series.iter().enumerate() {
                let col = PALETTE[i % PALETTE.len()];
                let y = lg.y + LEGEND_PAD + i as f64 * lg.row + lg.row / 2.0;
                let x = lg.x + LEGEND_PAD;
                c.line((x, y), (x + LEGEND_SWATCH, y), 2.0, col);
                c.disc(x + LEGEND_SWATCH / 2.0, y, 3.0, col);
                let (_, th) = text_size(1, f.tick_scale);
                c.text(x + LEGEND_SWATCH + LEGEND_PAD, y - th / 2.0, &se.name, f.tick_scale, Rgb::BLACK);
            }
        }
        c
    }
}

/// Text sizes of a renderer, in font-pixel scales of the 5×7 font (the SVG
/// uses the same metrics so both renderings share one layout).
struct FontMetrics {
    tick_scale: usize,
    label_scale: usize,
    title_scale: usize,
}

const PNG_FONT: FontMetrics = FontMetrics { tick_scale: 2, label_scale: 2, title_scale: 3 };
const SVG_FONT: FontMetrics = FontMetrics { tick_scale: 2, label_scale: 2, title_scale: 3 };

const LEGEND_PAD: f64 = 8.0;
const LEGEND_SWATCH: f64 = 24.0;

struct Rect {
    left: f64,
    top: f64,
    right: f64,
    bottom: f64,
}

struct Tick {
    pixel: f64,
    label: String,
}

struct Legend {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
    row: f64,
}

struct Layout {
    plot: Rect,
    x_ticks: Vec<Tick>,
    y_ticks: Vec<Tick>,
    series_px: Vec<Vec<(f64, f64)>>,
    /// The title as drawn (shortened with `...` when even the smallest
    /// scale is too wide), its scale, left edge and width.
    title: String,
    title_scale: usize,
    title_x: f64,
    title_w: f64,
    title_y: f64,
    x_label_y: f64,
    y_label_x: f64,
    legend: Option<Legend>,
}

impl Chart {
    fn usable_points(&self, s: &Series) -> Vec<(f64, f64)> {
        s.points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite() && (!self.log_x || *x > 0.0)).collect()
    }

    fn layout(&self, f: &FontMetrics) -> Layout {
        let pts: Vec<Vec<(f64, f64)>> = self.series.iter().map(|s| self.usable_points(s)).collect();
        let all = pts.iter().flatten();
        let tx = |x: f64| if self.log_x { x.log10() } else { x };
        let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
        for &(x, y) in all {
            x0 = x0.min(tx(x));
            x1 = x1.max(tx(x));
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        let (x0, x1) = pad_range(x0, x1, 0.03);
        let (y0, y1) = pad_range(y0, y1, 0.06);
        let x_ticks_v = if self.log_x { log_ticks(x0, x1) } else { linear_ticks(x0, x1, 7) };
        let y_ticks_v = linear_ticks(y0, y1, 6);

        let (_, tick_h) = text_size(1, f.tick_scale);
        let (_, label_h) = text_size(1, f.label_scale);
        let (w, h) = (self.width as f64, self.height as f64);
        let margin = 12.0;
        let (title, title_scale) = fit_title(&self.title, f.title_scale, w - 2.0 * margin);
        let (_, title_h) = text_size(1, title_scale);
        let y_tick_w = y_ticks_v.iter().map(|(_, l)| text_size(l.chars().count(), f.tick_scale).0).fold(0.0, f64::max);
        let top = margin + if self.title.is_empty() { 0.0 } else { title_h + 14.0 };
        let left = margin + y_tick_w + 10.0 + if self.y_label.is_empty() { 0.0 } else { label_h + 12.0 };
        let bottom_band = 6.0 + tick_h + 10.0 + if self.x_label.is_empty() { 0.0 } else { label_h + 8.0 };
        let named = self.series.iter().any(|s| !s.name.is_empty());
        let legend_w = if named {
            let longest = self.series.iter().map(|s| s.name.chars().count()).max().unwrap_or(0);
            3.0 * LEGEND_PAD + LEGEND_SWATCH + text_size(longest, f.tick_scale).0
        } else {
            0.0
        };
        let right = (w - margin - if named { legend_w + 12.0 } else { 0.0 }).max(left + 40.0);
        let bottom = (h - margin - bottom_band).max(top + 40.0);
        let plot = Rect { left, top, right, bottom };
        let px = |v: f64| left + (v - x0) / (x1 - x0) * (right - left);
        let py = |v: f64| bottom - (v - y0) / (y1 - y0) * (bottom - top);
        let legend = named.then(|| {
            let row = tick_h + 8.0;
            Legend {
                x: right + 12.0,
                y: top,
                w: legend_w,
                h: 2.0 * LEGEND_PAD + row * self.series.len() as f64 - 8.0,
                row,
            }
        });
        Layout {
            x_ticks: x_ticks_v.into_iter().map(|(v, label)| Tick { pixel: px(v), label }).collect(),
            y_ticks: y_ticks_v.into_iter().map(|(v, label)| Tick { pixel: py(v), label }).collect(),
            series_px: pts.iter().map(|s| s.iter().map(|&(x, y)| (px(tx(x)), py(y))).collect()).collect(),
            title_w: text_size(title.chars().count(), title_scale).0,
            title_x: {
                let tw = text_size(title.chars().count(), title_scale).0;
                ((left + right - tw) / 2.0).clamp(margin, (w - margin - tw).max(margin))
            },
            title,
            title_scale,
            title_y: margin,
            x_label_y: bottom + 6.0 + tick_h + 10.0,
            y_label_x: margin,
            legend,
            plot,
        }
    }
}

/// The largest scale (≤ `max`) at which `title` fits `width`; at scale 1
/// a title still too wide is cut and ends in `...`.
fn fit_title(title: &str, max: usize, width: f64) -> (String, usize) {
    let n = title.chars().count();
    for scale in (1..=max.max(1)).rev() {
        if text_size(n, scale).0 <= width {
            return (title.to_string(), scale);
        }
    }
    let keep = ((width + 1.0) / font::CELL_W as f64) as usize;
    let cut: String = title.chars().take(keep.saturating_sub(3)).collect();
    (format!("{cut}..."), 1)
}

/// Widens [a, b] by `frac` of its span on each side; an empty or degenerate
/// range becomes one around its value.
fn pad_range(a: f64, b: f64, frac: f64) -> (f64, f64) {
    if !a.is_finite() || !b.is_finite() {
        return (0.0, 1.0);
    }
    if b - a <= f64::EPSILON * a.abs().max(1.0) {
        let d = if a == 0.0 { 1.0 } else { a.abs() * 0.1 };
        return (a - d, b + d);
    }
    let pad = (b - a) * frac;
    (a - pad, b + pad)
}

/// A step of 1, 2 or 5 × 10ᵏ giving about `n` ticks over `span`.
fn nice_step(span: f64, n: usize) -> f64 {
    let raw = span / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// Ticks at multiples of a nice step inside [a, b], with labels.
fn linear_ticks(a: f64, b: f64, n: usize) -> Vec<(f64, String)> {
    let step = nice_step(b - a, n);
    let first = (a / step).ceil() as i64;
    let last = (b / step).floor() as i64;
    (first..=last)
        .map(|k| {
            let v = k as f64 * step;
            (v, format_tick(if v.abs() < step * 1e-9 { 0.0 } else { v }, step))
        })
        .collect()
}

/// Ticks of a log10 axis whose range is [a, b] in log10 units: powers of
/// ten, with 2× and 5× added when fewer than three decades show, and a
/// linear fallback inside a single decade.
fn log_ticks(a: f64, b: f64) -> Vec<(f64, String)> {
    let (lo, hi) = (a.floor() as i64, b.ceil() as i64);
    let mut out = Vec::new();
    let decades = (b - a).max(0.0);
    let mults: &[f64] = if decades < 3.0 { &[1.0, 2.0, 5.0] } else { &[1.0] };
    for e in lo..=hi {
        for &m in mults {
            let v = m * 10f64.powi(e as i32);
            let l = v.log10();
            if l >= a - 1e-12 && l <= b + 1e-12 {
                out.push((l, format_tick(v, 10f64.powi(e as i32))));
            }
        }
    }
    if out.len() < 2 {
        let (va, vb) = (10f64.powf(a), 10f64.powf(b));
        return linear_ticks(va, vb, 4).into_iter().filter(|(v, _)| *v > 0.0).map(|(v, l)| (v.log10(), l)).collect();
    }
    out
}

/// A tick label: as many decimals as the step needs, exponent form for
/// very large or very small magnitudes.
fn format_tick(v: f64, step: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-4..1e7).contains(&a) {
        let s = format!("{v:.1e}");
        return s.replace(".0e", "e");
    }
    let decimals = if step >= 1.0 { 0 } else { (-step.log10()).ceil().clamp(0.0, 6.0) as usize };
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// XML-escapes text content and attribute values.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_nice_and_labelled() {
        let t = linear_ticks(0.0, 1.0, 5);
        let labels: Vec<&str> = t.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["0", "0.2", "0.4", "0.6", "0.8", "1"]);
        let t = linear_ticks(95.0, 1005.0, 5);
        assert_eq!(t.first().unwrap().1, "200");
        let t = log_ticks(0.0, 3.0); // 1 … 1000
        let labels: Vec<&str> = t.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["1", "10", "100", "1000"]);
        let t = log_ticks(0.69, 2.0); // 5 … 100
        let labels: Vec<&str> = t.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["5", "10", "20", "50", "100"]);
        let t = log_ticks(1.1, 1.2); // inside one decade
        assert!(t.len() >= 2, "{t:?}");
        assert_eq!(format_tick(0.05, 0.01), "0.05");
        assert_eq!(format_tick(2.5e8, 1e8), "2.5e8");
        assert_eq!(format_tick(-3.0, 1.0), "-3");
    }

    #[test]
    fn degenerate_ranges_do_not_divide_by_zero() {
        assert_eq!(pad_range(f64::INFINITY, f64::NEG_INFINITY, 0.1), (0.0, 1.0));
        let (a, b) = pad_range(5.0, 5.0, 0.1);
        assert!(a < 5.0 && b > 5.0);
        let chart = Chart::new("one point").series("s", vec![(1.0, 1.0)]);
        assert!(chart.to_svg().contains("<circle"));
        let empty = Chart::new("").to_png();
        assert!(empty.starts_with(&png::SIGNATURE));
    }

    #[test]
    fn long_titles_shrink_then_shorten() {
        assert_eq!(fit_title("short", 3, 500.0), ("short".to_string(), 3));
        let t = "x".repeat(40); // 239 px at scale 1, 478 at 2, 717 at 3
        assert_eq!(fit_title(&t, 3, 500.0).1, 2);
        let (cut, scale) = fit_title(&"y".repeat(200), 3, 300.0);
        assert_eq!(scale, 1);
        assert!(cut.ends_with("...") && text_size(cut.chars().count(), 1).0 <= 300.0, "{cut}");
        let c = Chart::new("z".repeat(300)).size(400, 300);
        let svg = c.to_svg();
        assert!(svg.contains("zzz...</text>"));
    }

    #[test]
    fn escaping() {
        assert_eq!(esc("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
