//! Line charts drawn with `plotters`: several named series of (x, y)
//! points, an optional logarithmic x axis, a title, axis labels and a
//! legend beside the plot, written as SVG ([`Chart::to_svg`]) or PNG
//! ([`Chart::to_png`], plotters' bitmap backend encoded by `png`). Text is
//! measured and, in PNGs, drawn with the DejaVu Sans font embedded in the
//! binary (regular weight only), so no system fonts are needed.
//!
//! ```
//! use kvslim_eval::chart::Chart;
//! let chart = Chart::new("PPL vs budget")
//!     .x_label("KV budget (%)")
//!     .y_label("perplexity")
//!     .log_x(true)
//!     .series("h2o", vec![(5.0, 9.1), (10.0, 7.2), (20.0, 6.4), (100.0, 6.1)])
//!     .series("window", vec![(5.0, 30.0), (10.0, 14.0), (20.0, 8.0), (100.0, 6.1)]);
//! assert!(chart.to_svg().unwrap().starts_with("<svg"));
//! assert!(chart.to_png().unwrap().starts_with(b"\x89PNG"));
//! ```
//!
//! Points whose coordinates are not finite (or x ≤ 0 on a log axis) are
//! skipped; a series' points are joined in the order given.

use plotters::coord::combinators::BindKeyPoints;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
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
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

const FONT: &str = "sans-serif";
const TITLE_PX: u32 = 24;
const LABEL_PX: u32 = 18;
const TICK_PX: u32 = 16;
const MARGIN: u32 = 12;
const SWATCH: i32 = 24;
const PAD: i32 = 8;

/// Registers the embedded font with plotters (once per process).
fn register_fonts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // the embedded font file is valid TrueType; a failure would only
        // leave text undrawn, which the tests would catch. Bold text (the
        // title) falls back to it in PNGs: one font keeps the binary
        // smaller; SVGs say `font-weight="bold"` and the viewer's font draws it.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

fn draw_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> std::io::Error {
    std::io::Error::other(format!("drawing the chart failed: {e}"))
}

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
            Some("svg") => std::fs::write(path, self.to_svg()?),
            Some("png") => std::fs::write(path, self.to_png()?),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{}: chart files must end in .svg or .png", path.display()),
            )),
        }
    }

    /// The chart as a standalone SVG document.
    pub fn to_svg(&self) -> std::io::Result<String> {
        let mut s = String::new();
        {
            let root = SVGBackend::with_string(&mut s, (self.width, self.height)).into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(draw_err)?;
        }
        Ok(s)
    }

    /// The chart as a PNG file.
    pub fn to_png(&self) -> std::io::Result<Vec<u8>> {
        let (w, h) = (self.width, self.height);
        let mut rgb = vec![0u8; w as usize * h as usize * 3];
        {
            let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(draw_err)?;
        }
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header().map_err(std::io::Error::other)?;
        writer.write_image_data(&rgb).map_err(std::io::Error::other)?;
        writer.finish().map_err(std::io::Error::other)?;
        Ok(out)
    }

    fn usable_points(&self, s: &Series) -> Vec<(f64, f64)> {
        s.points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite() && (!self.log_x || *x > 0.0)).collect()
    }

    /// Title, legend and plot on `root`.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> std::io::Result<()> {
        register_fonts();
        root.fill(&WHITE).map_err(draw_err)?;
        let area = if self.title.is_empty() {
            root.margin(MARGIN, 0, 0, 0)
        } else {
            let (title, px) = self.fit_title(root);
            let style = (FONT, px).into_font().style(FontStyle::Bold).color(&BLACK);
            root.margin(MARGIN, 0, 0, 0).titled(&title, style).map_err(draw_err)?
        };
        let named = self.series.iter().any(|s| !s.name.is_empty());
        let tick: TextStyle = (FONT, TICK_PX).into_font().into();
        let plot = if named {
            let widest = self
                .series
                .iter()
                .map(|s| area.estimate_text_size(&s.name, &tick).map_or(0, |(w, _)| w as i32))
                .max()
                .unwrap_or(0);
            let legend_w = (3 * PAD + SWATCH + widest + MARGIN as i32) as u32;
            let split = (self.width.saturating_sub(legend_w)).max(self.width / 2);
            let (plot, legend) = area.split_horizontally(split);
            self.draw_legend(&legend)?;
            plot
        } else {
            area
        };
        let pts: Vec<Vec<(f64, f64)>> = self.series.iter().map(|s| self.usable_points(s)).collect();
        let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
        for &(x, y) in pts.iter().flatten() {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        let y = pad_range(y0, y1, 0.06);
        if self.log_x {
            let (a, b) = if x0.is_finite() { pad_range(x0.log10(), x1.log10(), 0.03) } else { (0.0, 1.0) };
            let x = (10f64.powf(a)..10f64.powf(b)).log_scale().with_key_points(log_ticks(a, b));
            self.draw_plot(&plot, x, y, &pts)
        } else {
            let (a, b) = pad_range(x0, x1, 0.03);
            self.draw_plot(&plot, a..b, y, &pts)
        }
    }

    fn draw_plot<DB, X>(
        &self,
        area: &DrawingArea<DB, Shift>,
        x: X,
        (y0, y1): (f64, f64),
        pts: &[Vec<(f64, f64)>],
    ) -> std::io::Result<()>
    where
        DB: DrawingBackend,
        X: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
    {
        let x_area = if self.x_label.is_empty() { 28 } else { 50 };
        // axis descriptions shrink (to 10 px) until the y one fits the height
        let room = area.dim_in_pixel().1.saturating_sub(x_area + 2 * MARGIN);
        let mut desc_px = LABEL_PX;
        while desc_px > 10
            && area.estimate_text_size(&self.y_label, &(FONT, desc_px).into_font().into()).map_or(0, |(w, _)| w) > room
        {
            desc_px -= 1;
        }
        let mut chart = ChartBuilder::on(area)
            .margin(MARGIN)
            .x_label_area_size(x_area)
            .y_label_area_size(if self.y_label.is_empty() { 56 } else { 76 })
            .build_cartesian_2d(x, y0..y1)
            .map_err(draw_err)?;
        let fmt = |v: &f64| format_tick(*v);
        chart
            .configure_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .x_labels(8)
            .y_labels(7)
            .x_label_formatter(&fmt)
            .y_label_formatter(&fmt)
            .label_style((FONT, TICK_PX))
            .axis_desc_style((FONT, desc_px))
            .bold_line_style(RGBColor(0xe4, 0xe4, 0xe4))
            .light_line_style(TRANSPARENT)
            .draw()
            .map_err(draw_err)?;
        for (i, p) in pts.iter().enumerate() {
            let c = PALETTE[i % PALETTE.len()];
            chart.draw_series(LineSeries::new(p.iter().copied(), c.stroke_width(2))).map_err(draw_err)?;
            chart.draw_series(p.iter().map(|&xy| Circle::new(xy, 3, c.filled()))).map_err(draw_err)?;
        }
        Ok(())
    }

    fn draw_legend<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> std::io::Result<()> {
        let style = (FONT, TICK_PX).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
        let row = TICK_PX as i32 + PAD;
        let top = MARGIN as i32 + PAD;
        let (w, _) = area.dim_in_pixel();
        let h = 2 * PAD + row * self.series.len() as i32 - PAD;
        area.draw(&Rectangle::new([(0, MARGIN as i32), (w as i32 - MARGIN as i32, MARGIN as i32 + h)], WHITE.filled()))
            .map_err(draw_err)?;
        area.draw(&Rectangle::new(
            [(0, MARGIN as i32), (w as i32 - MARGIN as i32, MARGIN as i32 + h)],
            RGBColor(0xc8, 0xc8, 0xc8),
        ))
        .map_err(draw_err)?;
        for (i, s) in self.series.iter().enumerate() {
            let c = PALETTE[i % PALETTE.len()];
            let y = top + i as i32 * row + row / 2 - PAD / 2;
            area.draw(&PathElement::new(vec![(PAD, y), (PAD + SWATCH, y)], c.stroke_width(2))).map_err(draw_err)?;
            area.draw(&Circle::new((PAD + SWATCH / 2, y), 3, c.filled())).map_err(draw_err)?;
            area.draw(&Text::new(s.name.clone(), (2 * PAD + SWATCH, y), style.clone())).map_err(draw_err)?;
        }
        Ok(())
    }

    /// The title and the largest font size (≤ 24 px, ≥ 10 px) at which it
    /// fits the width; at 10 px a title still too wide is cut and ends in `...`.
    fn fit_title<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> (String, u32) {
        let room = self.width.saturating_sub(2 * MARGIN);
        let width = |t: &str, px: u32| {
            root.estimate_text_size(t, &(FONT, px).into_font().style(FontStyle::Bold).into()).map_or(0, |(w, _)| w)
        };
        for px in (10..=TITLE_PX).rev().step_by(2) {
            if width(&self.title, px) <= room {
                return (self.title.clone(), px);
            }
        }
        let mut t: Vec<char> = self.title.chars().collect();
        while !t.is_empty() && width(&format!("{}...", t.iter().collect::<String>()), 10) > room {
            t.pop();
        }
        (format!("{}...", t.iter().collect::<String>()), 10)
    }
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

/// Ticks of a log10 axis spanning [a, b] in log10 units: powers of ten,
/// with 2× and 5× added when fewer than three decades show, and about
/// four evenly spaced values inside a single decade.
fn log_ticks(a: f64, b: f64) -> Vec<f64> {
    let mults: &[f64] = if b - a < 3.0 { &[1.0, 2.0, 5.0] } else { &[1.0] };
    let mut out = Vec::new();
    for e in a.floor() as i32..=b.ceil() as i32 {
        for &m in mults {
            let v = m * 10f64.powi(e);
            if (a - 1e-12..=b + 1e-12).contains(&v.log10()) {
                out.push(v);
            }
        }
    }
    if out.len() < 2 {
        let (lo, hi) = (10f64.powf(a), 10f64.powf(b));
        let step = 10f64.powf(((hi - lo) / 4.0).log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * step).find(|s| (hi - lo) / s <= 6.0).unwrap_or(step * 10.0);
        out = (((lo / step).ceil() as i64)..=((hi / step).floor() as i64)).map(|k| k as f64 * step).collect();
    }
    out
}

/// A tick label with four significant digits and no trailing zeros;
/// exponent form for very large or very small magnitudes.
fn format_tick(v: f64) -> String {
    let a = v.abs();
    if a < 1e-12 {
        return "0".into();
    }
    if !(1e-4..1e7).contains(&a) {
        return format!("{v:.1e}").replace(".0e", "e");
    }
    let decimals = (3 - a.log10().floor() as i32).clamp(0, 8) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Chart {
        Chart::new("quality <vs> budget & more")
            .x_label("KV budget (% of sequence)")
            .y_label("ppl")
            .log_x(true)
            .size(640, 400)
            .series("full", vec![(5.0, 17.0), (50.0, 17.0)])
            .series("h2o", vec![(5.0, 31.0), (10.0, 22.5), (f64::NAN, 1.0), (50.0, 17.6)])
            .series("window", vec![(5.0, 80.0), (10.0, 41.0), (0.0, 3.0), (50.0, 18.3)])
    }

    #[test]
    fn log_ticks_are_nice() {
        assert_eq!(log_ticks(0.0, 3.0), [1.0, 10.0, 100.0, 1000.0]);
        assert_eq!(log_ticks(0.69, 2.0), [5.0, 10.0, 20.0, 50.0, 100.0]);
        let t = log_ticks(1.1, 1.2); // 12.6 … 15.8, inside one decade
        assert!(t.len() >= 2 && t.iter().all(|v| (12.5..16.0).contains(v)), "{t:?}");
    }

    #[test]
    fn tick_labels() {
        assert_eq!(format_tick(0.0), "0");
        assert_eq!(format_tick(0.30000000000000004), "0.3");
        assert_eq!(format_tick(0.05), "0.05");
        assert_eq!(format_tick(250.0), "250");
        assert_eq!(format_tick(17.25), "17.25");
        assert_eq!(format_tick(-3.0), "-3");
        assert_eq!(format_tick(2.5e8), "2.5e8");
    }

    #[test]
    fn degenerate_ranges_do_not_divide_by_zero() {
        assert_eq!(pad_range(f64::INFINITY, f64::NEG_INFINITY, 0.1), (0.0, 1.0));
        let (a, b) = pad_range(5.0, 5.0, 0.1);
        assert!(a < 5.0 && b > 5.0);
        for c in [
            Chart::new("one point").series("s", vec![(1.0, 1.0)]),
            Chart::new(""),
            Chart::new("log, no points").log_x(true).series("s", vec![(-1.0, 2.0)]),
        ] {
            assert!(c.to_svg().unwrap().contains("</svg>"));
            assert!(c.to_png().unwrap().starts_with(b"\x89PNG"));
        }
    }

    #[test]
    fn png_decodes_to_the_requested_size_with_ink_in_series_colours() {
        let bytes = sample().to_png().unwrap();
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().unwrap();
        let mut px = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut px).unwrap();
        assert_eq!((info.width, info.height, info.color_type), (640, 400, png::ColorType::Rgb));
        let count = |c: [u8; 3]| px.chunks_exact(3).filter(|p| *p == c).count();
        assert!(count([255, 255, 255]) > px.len() / 3 / 2, "mostly white");
        assert!(count([0x1f, 0x77, 0xb4]) > 50, "first series colour");
        assert!(count([0xff, 0x7f, 0x0e]) > 50, "second series colour");
        assert!(count([0x2c, 0xa0, 0x2c]) > 50, "third series colour");
        // text is drawn with the embedded font (dark, anti-aliased pixels)
        assert!(px.chunks_exact(3).filter(|p| p.iter().all(|&v| v < 60)).count() > 300, "title and labels");
    }

    #[test]
    fn svg_names_every_series_and_escapes_text() {
        let svg = sample().to_svg().unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for name in ["full", "h2o", "window", "KV budget (% of sequence)", "ppl"] {
            assert!(svg.contains(&format!(">{name}</text>")) || svg.contains(&format!(">\n{name}\n</text>")), "{name}");
        }
        assert!(svg.contains("quality &lt;vs&gt; budget &amp; more"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn long_titles_shrink_then_shorten() {
        let c = Chart::new("z".repeat(300)).size(400, 300);
        let svg = c.to_svg().unwrap();
        assert!(svg.contains("zzz...<") || svg.contains("zzz...\n"), "{svg}");
        let short = Chart::new("short");
        let mut buf = String::new();
        let root = SVGBackend::with_string(&mut buf, (800, 500)).into_drawing_area();
        register_fonts();
        assert_eq!(short.fit_title(&root), ("short".to_string(), TITLE_PX));
    }

    #[test]
    fn save_picks_the_format_from_the_extension() {
        let dir = std::env::temp_dir().join(format!("kvslim-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let chart = sample();
        chart.save(&dir.join("c.png")).unwrap();
        chart.save(&dir.join("c.svg")).unwrap();
        assert!(std::fs::read(dir.join("c.png")).unwrap().starts_with(b"\x89PNG"));
        assert!(std::fs::read_to_string(dir.join("c.svg")).unwrap().starts_with("<svg"));
        assert!(chart.save(&dir.join("c.jpg")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
