//! An RGB canvas with anti-aliased lines and discs, rectangles and bitmap
//! text: just what a line chart needs.

use crate::font;

/// An sRGB colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    pub const WHITE: Rgb = Rgb(255, 255, 255);
    pub const BLACK: Rgb = Rgb(0, 0, 0);

    /// `#rrggbb` for SVG.
    pub fn hex(self) -> String {
        format!("#{:02x}{:02x}{:02x}", self.0, self.1, self.2)
    }
}

/// A width × height RGB image, rows top to bottom.
pub struct Canvas {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

impl Canvas {
    pub fn new(width: u32, height: u32, background: Rgb) -> Self {
        let n = width as usize * height as usize;
        let mut pixels = Vec::with_capacity(n * 3);
        for _ in 0..n {
            pixels.extend_from_slice(&[background.0, background.1, background.2]);
        }
        Canvas { width, height, pixels }
    }

    /// The colour at (x, y), if inside.
    pub fn get(&self, x: i64, y: i64) -> Option<Rgb> {
        if x < 0 || y < 0 || x >= self.width as i64 || y >= self.height as i64 {
            return None;
        }
        let i = (y as usize * self.width as usize + x as usize) * 3;
        Some(Rgb(self.pixels[i], self.pixels[i + 1], self.pixels[i + 2]))
    }

    /// Mixes `c` into pixel (x, y) with opacity `alpha` in [0, 1]; outside
    /// pixels are ignored.
    pub fn blend(&mut self, x: i64, y: i64, c: Rgb, alpha: f32) {
        if x < 0 || y < 0 || x >= self.width as i64 || y >= self.height as i64 || alpha <= 0.0 {
            return;
        }
        let a = alpha.min(1.0);
        let i = (y as usize * self.width as usize + x as usize) * 3;
        for (k, v) in [c.0, c.1, c.2].into_iter().enumerate() {
            let old = self.pixels[i + k] as f32;
            self.pixels[i + k] = (old + (v as f32 - old) * a).round() as u8;
        }
    }

    /// Fills the pixels whose centres lie in [x0, x1) × [y0, y1).
    pub fn fill_rect(&mut self, x0: f64, y0: f64, x1: f64, y1: f64, c: Rgb) {
        let (xa, xb) = (x0.min(x1).round() as i64, x0.max(x1).round() as i64);
        let (ya, yb) = (y0.min(y1).round() as i64, y0.max(y1).round() as i64);
        for y in ya..yb {
            for x in xa..xb {
                self.blend(x, y, c, 1.0);
            }
        }
    }

    /// Outline of a rectangle, one pixel wide.
    pub fn stroke_rect(&mut self, x0: f64, y0: f64, x1: f64, y1: f64, c: Rgb) {
        self.fill_rect(x0, y0, x1, y0 + 1.0, c);
        self.fill_rect(x0, y1 - 1.0, x1, y1, c);
        self.fill_rect(x0, y0, x0 + 1.0, y1, c);
        self.fill_rect(x1 - 1.0, y0, x1, y1, c);
    }

    /// An anti-aliased segment of the given width (pixel coverage from the
    /// distance of each pixel centre to the segment).
    pub fn line(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), width: f64, c: Rgb) {
        let half = width / 2.0;
        let pad = half + 1.0;
        let (xa, xb) = ((x0.min(x1) - pad).floor() as i64, (x0.max(x1) + pad).ceil() as i64);
        let (ya, yb) = ((y0.min(y1) - pad).floor() as i64, (y0.max(y1) + pad).ceil() as i64);
        let (xa, xb) = (xa.max(0), xb.min(self.width as i64));
        let (ya, yb) = (ya.max(0), yb.min(self.height as i64));
        let (dx, dy) = (x1 - x0, y1 - y0);
        let len2 = dx * dx + dy * dy;
        for y in ya..yb {
            for x in xa..xb {
                let (px, py) = (x as f64 + 0.5, y as f64 + 0.5);
                let t = if len2 > 0.0 { (((px - x0) * dx + (py - y0) * dy) / len2).clamp(0.0, 1.0) } else { 0.0 };
                let (qx, qy) = (x0 + t * dx - px, y0 + t * dy - py);
                let d = (qx * qx + qy * qy).sqrt();
                let cover = (half + 0.5 - d).clamp(0.0, 1.0);
                if cover > 0.0 {
                    self.blend(x, y, c, cover as f32);
                }
            }
        }
    }

    /// An anti-aliased filled disc.
    pub fn disc(&mut self, cx: f64, cy: f64, r: f64, c: Rgb) {
        let (xa, xb) = ((cx - r - 1.0).floor() as i64, (cx + r + 1.0).ceil() as i64);
        let (ya, yb) = ((cy - r - 1.0).floor() as i64, (cy + r + 1.0).ceil() as i64);
        for y in ya..yb {
            for x in xa..xb {
                let d = ((x as f64 + 0.5 - cx).powi(2) + (y as f64 + 0.5 - cy).powi(2)).sqrt();
                self.blend(x, y, c, (r + 0.5 - d).clamp(0.0, 1.0) as f32);
            }
        }
    }

    /// Draws `text` with its top-left corner at (x, y), each font pixel
    /// `scale` × `scale` image pixels.
    pub fn text(&mut self, x: f64, y: f64, text: &str, scale: usize, c: Rgb) {
        let (x0, y0) = (x.round() as i64, y.round() as i64);
        let s = scale as i64;
        for (i, ch) in text.chars().enumerate() {
            let g = font::glyph(ch);
            let gx = x0 + (i * font::CELL_W * scale) as i64;
            for (r, bits) in g.iter().enumerate() {
                for col in 0..font::GLYPH_W {
                    if bits & (1 << (font::GLYPH_W - 1 - col)) != 0 {
                        for dy in 0..s {
                            for dx in 0..s {
                                self.blend(gx + col as i64 * s + dx, y0 + r as i64 * s + dy, c, 1.0);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Draws `text` rotated a quarter turn counter-clockwise (reading bottom
    /// to top), its bounding box's bottom-left corner at (x, y).
    pub fn text_up(&mut self, x: f64, y: f64, text: &str, scale: usize, c: Rgb) {
        let (x0, y0) = (x.round() as i64, y.round() as i64);
        let s = scale as i64;
        for (i, ch) in text.chars().enumerate() {
            let g = font::glyph(ch);
            // glyph column `col` goes up the image; glyph row `r` goes right
            let base_y = y0 - (i * font::CELL_W * scale) as i64;
            for (r, bits) in g.iter().enumerate() {
                for col in 0..font::GLYPH_W {
                    if bits & (1 << (font::GLYPH_W - 1 - col)) != 0 {
                        let px = x0 + r as i64 * s;
                        let py = base_y - (col as i64 + 1) * s;
                        for dy in 0..s {
                            for dx in 0..s {
                                self.blend(px + dx, py + dy, c, 1.0);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Width and height in image pixels of `chars` characters at `scale`.
pub fn text_size(chars: usize, scale: usize) -> (f64, f64) {
    let w = if chars == 0 { 0 } else { chars * font::CELL_W - 1 };
    ((w * scale) as f64, (font::GLYPH_H * scale) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_discs_and_text_ink_where_expected() {
        let mut c = Canvas::new(40, 30, Rgb::WHITE);
        c.line((2.0, 5.0), (37.0, 5.0), 2.0, Rgb::BLACK);
        assert_eq!(c.get(20, 4), Some(Rgb::BLACK));
        assert_eq!(c.get(20, 5), Some(Rgb::BLACK));
        assert_eq!(c.get(20, 9), Some(Rgb::WHITE));
        c.disc(20.0, 20.0, 3.0, Rgb(255, 0, 0));
        assert_eq!(c.get(20, 20), Some(Rgb(255, 0, 0)));
        let mut t = Canvas::new(20, 10, Rgb::WHITE);
        t.text(0.0, 0.0, "-", 1, Rgb::BLACK);
        assert_eq!(t.get(0, 3), Some(Rgb::BLACK));
        assert_eq!(t.get(0, 2), Some(Rgb::WHITE));
        let mut u = Canvas::new(10, 20, Rgb::WHITE);
        u.text_up(0.0, 10.0, "-", 1, Rgb::BLACK); // a vertical bar at x = 3
        assert_eq!(u.get(3, 9), Some(Rgb::BLACK));
        assert_eq!(u.get(3, 5), Some(Rgb::BLACK));
        assert_eq!(u.get(2, 7), Some(Rgb::WHITE));
        assert_eq!(text_size(3, 2), (34.0, 14.0));
    }
}
