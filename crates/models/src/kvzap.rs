//! KVzap-style predictors (`prefill=kvzap[:FILE]`, docs/policies.md §1
//! prefill): per layer and KV head a linear map from the layer's
//! normalised input hidden state x̂ (the attention norm's output) to the
//! log of the token's KVzip score, so a prompt is scored during its one
//! prefill instead of by a repeat probe. `kvslim calibrate --kvzap` fits
//! one ([`KvzapPredictor::save`]); a policy reads it
//! ([`crate::Model::kvzap_predictor`]).
//!
//! File format (all integers and floats little-endian):
//!
//! ```text
//! 8 bytes   magic "KVSLIMZP"
//! u32       format version (1)
//! u32       H, the header's length
//! H bytes   header, JSON (KvzapMeta: model fingerprint, shape, target, calibration, quality)
//! f32 × L·K·(d+1)   per layer, per KV head: the bias, then d weights
//! u32       CRC-32 of every byte before it
//! ```

use crate::{Error, Result};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"KVSLIMZP";
const VERSION: u32 = 1;
/// What a predictor's header says it is.
pub const KVZAP_KIND: &str = "kvslim-kvzap";
/// The file name extension, after the model's fingerprint.
pub const KVZAP_EXT: &str = "kvzap";

/// A predictor's header: which model it fits and how it was made.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KvzapMeta {
    /// Always [`KVZAP_KIND`].
    pub kind: String,
    /// [`crate::Model::fingerprint`] of the model it was fitted on.
    pub model: String,
    pub layers: usize,
    pub kv_heads: usize,
    /// The hidden size d: each row holds a bias and d weights.
    pub hidden: usize,
    /// The target of the fit, `ln(kvzip + eps)`.
    pub eps: f64,
    /// How it was made (text, windows, ridge), for a person to check.
    #[serde(default)]
    pub calibration: serde_json::Value,
    /// Fit quality on held-out windows.
    #[serde(default)]
    pub quality: serde_json::Value,
}

/// A fitted predictor: per (layer, KV head) a bias and `hidden` weights.
#[derive(Clone, Debug, PartialEq)]
pub struct KvzapPredictor {
    pub meta: KvzapMeta,
    /// `layers × kv_heads` rows of `hidden + 1` values: bias, then weights.
    pub weights: Vec<f32>,
}

impl KvzapPredictor {
    /// Row (bias, weights) of layer `layer`, KV head `kv`.
    pub fn row(&self, layer: usize, kv: usize) -> &[f32] {
        let w = self.meta.hidden + 1;
        let at = (layer * self.meta.kv_heads + kv) * w;
        &self.weights[at..at + w]
    }

    /// The predicted log KVzip score of a token whose normalised hidden
    /// state is `x`, in f64.
    pub fn predict(&self, layer: usize, kv: usize, x: &[f32]) -> f64 {
        let row = self.row(layer, kv);
        row[1..].iter().zip(x).fold(row[0] as f64, |acc, (&w, &v)| acc + w as f64 * v as f64)
    }

    /// The score a candidate gets: exp of the prediction, capped at 1 (a
    /// KVzip score is an attention probability), in f32.
    pub fn score(&self, layer: usize, kv: usize, x: &[f32]) -> f32 {
        self.predict(layer, kv, x).min(0.0).exp() as f32
    }

    /// The file's bytes (deterministic: the same predictor, the same bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let header = serde_json::to_vec(&self.meta).expect("a header always serialises");
        let mut out = Vec::with_capacity(20 + header.len() + 4 * self.weights.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        self.weights.iter().for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads a predictor from its bytes; `what` names the source in errors.
    pub fn from_bytes(bytes: &[u8], what: &Path) -> Result<Self> {
        let bad = |reason: String| Error::Format { path: what.to_path_buf(), reason };
        if bytes.len() < 20 || &bytes[..8] != MAGIC {
            return Err(bad(
                "not a KVzap predictor (no KVSLIMZP header; make one with `kvslim calibrate --kvzap`)".into()
            ));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        if crc32fast::hash(body).to_le_bytes() != tail {
            return Err(bad("checksum mismatch: the file is damaged or truncated".into()));
        }
        let u32_at = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().expect("4 bytes"));
        let version = u32_at(8);
        if version != VERSION {
            return Err(bad(format!("format version {version}, this build reads {VERSION}")));
        }
        let h = u32_at(12) as usize;
        let header = body.get(16..16 + h).ok_or_else(|| bad("header runs past the end".into()))?;
        let meta: KvzapMeta = serde_json::from_slice(header).map_err(|e| bad(format!("bad header: {e}")))?;
        if meta.kind != KVZAP_KIND {
            return Err(bad(format!("header kind `{}`, not `{KVZAP_KIND}`", meta.kind)));
        }
        let floats = &body[16 + h..];
        let want = meta.layers * meta.kv_heads * (meta.hidden + 1);
        if floats.len() != 4 * want {
            return Err(bad(format!(
                "{} weight bytes for {} layers × {} KV heads × {} (expected {})",
                floats.len(),
                meta.layers,
                meta.kv_heads,
                meta.hidden + 1,
                4 * want
            )));
        }
        let weights: Vec<f32> =
            floats.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
        if weights.iter().any(|w| !w.is_finite()) {
            return Err(bad("a weight is not finite".into()));
        }
        Ok(KvzapPredictor { meta, weights })
    }

    /// Reads `path`; the error names it.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        Self::from_bytes(&bytes, path)
    }

    /// Writes the file (its folder created if missing).
    pub fn save(&self, path: &Path) -> Result<()> {
        let io = |source| Error::Io { path: path.to_path_buf(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(path, self.to_bytes()).map_err(io)
    }

    /// Checks that it fits a model of this fingerprint and shape.
    pub fn check(&self, fingerprint: &str, layers: usize, kv_heads: usize, hidden: usize, what: &Path) -> Result<()> {
        let m = &self.meta;
        let bad = |reason: String| Error::Format { path: what.to_path_buf(), reason };
        if (m.layers, m.kv_heads, m.hidden) != (layers, kv_heads, hidden) {
            return Err(bad(format!(
                "a predictor for {} layers × {} KV heads, hidden {}; this model has {layers} × {kv_heads}, hidden {hidden}",
                m.layers, m.kv_heads, m.hidden
            )));
        }
        if m.model != fingerprint {
            return Err(bad(format!(
                "fitted on model {}, not this one ({fingerprint}); make one with `kvslim calibrate --kvzap --model M`",
                m.model
            )));
        }
        Ok(())
    }
}

/// `$KVSLIM_KVZAP_DIR` when set, else `~/.cache/kvslim/kvzap`: where
/// `kvslim calibrate --kvzap` writes without `-o`, and the first place a
/// policy looks.
pub fn kvzap_user_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("KVSLIM_KVZAP_DIR") {
        return Some(PathBuf::from(d));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("kvslim").join("kvzap"))
}

/// The repository's fitted predictors (`calib/kvzap/`, committed), as
/// this build's source tree has them.
pub fn kvzap_repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("..").join("calib").join("kvzap")
}

/// The predictor file name of a model: `<fingerprint>.kvzap`.
pub fn kvzap_file_name(fingerprint: &str) -> String {
    format!("{fingerprint}.{KVZAP_EXT}")
}

/// Where `prefill=kvzap` (no file) finds the predictor of the model with
/// `fingerprint`: [`kvzap_user_dir`], then [`kvzap_repo_dir`]. The error
/// names the places and the command that makes one.
pub fn find_kvzap(fingerprint: &str) -> Result<PathBuf> {
    let name = kvzap_file_name(fingerprint);
    let dirs: Vec<PathBuf> = kvzap_user_dir().into_iter().chain([kvzap_repo_dir()]).collect();
    if let Some(p) = dirs.iter().map(|d| d.join(&name)).find(|p| p.is_file()) {
        return Ok(p);
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Err(Error::Unsupported(format!(
        "prefill=kvzap: no predictor {name} for this model (looked in {}); make one with \
         `kvslim calibrate --kvzap --model M --text TEXT`, or name a file with prefill=kvzap:FILE",
        looked.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> KvzapPredictor {
        let meta = KvzapMeta {
            kind: KVZAP_KIND.into(),
            model: "llama-2l-4d-8v-00000000".into(),
            layers: 2,
            kv_heads: 3,
            hidden: 4,
            eps: 1e-6,
            calibration: serde_json::json!({"windows": 1}),
            quality: serde_json::Value::Null,
        };
        let weights = (0..2 * 3 * 5).map(|i| i as f32 * 0.25 - 3.0).collect();
        KvzapPredictor { meta, weights }
    }

    #[test]
    fn round_trip_and_bad_files() {
        let p = sample();
        let dir = std::env::temp_dir().join(format!("kvzap-rt-{}", std::process::id()));
        let path = dir.join("p.kvzap");
        p.save(&path).unwrap();
        let back = KvzapPredictor::load(&path).unwrap();
        assert_eq!(back, p);
        assert_eq!(std::fs::read(&path).unwrap(), p.to_bytes(), "same predictor, same bytes");
        let bytes = p.to_bytes();
        let what = Path::new("x.kvzap");
        let err = |b: &[u8]| KvzapPredictor::from_bytes(b, what).unwrap_err().to_string();
        assert!(err(b"{\"kind\":1}").contains("not a KVzap predictor"));
        assert!(err(&bytes[..bytes.len() - 9]).contains("checksum"));
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert!(err(&flipped).contains("checksum"));
        assert!(KvzapPredictor::load(&dir.join("missing.kvzap")).unwrap_err().to_string().contains("missing.kvzap"));
        // the shape and the fingerprint are checked
        assert!(back.check("llama-2l-4d-8v-00000000", 2, 3, 4, what).is_ok());
        assert!(back.check("other", 2, 3, 4, what).unwrap_err().to_string().contains("calibrate --kvzap"));
        assert!(back.check("llama-2l-4d-8v-00000000", 2, 2, 4, what).unwrap_err().to_string().contains("KV heads"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn score_is_exp_of_the_prediction_capped_at_one() {
        let p = sample();
        let x = [1.0f32, -2.0, 0.5, 0.0];
        let row = p.row(1, 2);
        let want = row[0] as f64 + row[1] as f64 - 2.0 * row[2] as f64 + 0.5 * row[3] as f64;
        assert_eq!(p.predict(1, 2, &x), want);
        assert_eq!(p.score(1, 2, &x), want.min(0.0).exp() as f32);
        assert_eq!(p.score(1, 2, &[100.0, 100.0, 100.0, 100.0]), 1.0);
    }
}
