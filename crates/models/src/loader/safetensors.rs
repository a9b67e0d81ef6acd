//! `.safetensors` reader: 8-byte little-endian header length, JSON header,
//! raw data. Also reads sharded checkpoints through
//! `model.safetensors.index.json`. Every offset and size is checked against
//! the file before any byte is read.

use crate::{Error, Result};
use kvslim_kernels::DType;
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Element type of a stored tensor (including the integer types reference
/// files use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StDtype {
    F32,
    F16,
    BF16,
    I64,
    I32,
    F64,
}

impl StDtype {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "F32" => StDtype::F32,
            "F16" => StDtype::F16,
            "BF16" => StDtype::BF16,
            "I64" => StDtype::I64,
            "I32" => StDtype::I32,
            "F64" => StDtype::F64,
            _ => return None,
        })
    }
    fn size(self) -> usize {
        match self {
            StDtype::F16 | StDtype::BF16 => 2,
            StDtype::F32 | StDtype::I32 => 4,
            StDtype::F64 | StDtype::I64 => 8,
        }
    }
    /// The weight storage type, when this can be a weight.
    pub fn weight_dtype(self) -> Option<DType> {
        match self {
            StDtype::F32 => Some(DType::F32),
            StDtype::F16 => Some(DType::F16),
            StDtype::BF16 => Some(DType::BF16),
            _ => None,
        }
    }
}

/// A tensor's location in a mapped file.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    file: usize,
    start: usize,
    end: usize,
}

/// A borrowed tensor.
pub struct RawTensor<'a> {
    pub name: &'a str,
    pub dtype: StDtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl RawTensor<'_> {
    /// Element count.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Converts to f32 (floating types only).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let wt = match self.dtype {
            StDtype::F64 => {
                return Ok(self
                    .bytes
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
                    .collect())
            }
            d => d.weight_dtype(),
        };
        let Some(dt) = wt else {
            return Err(Error::ShapeMismatch {
                name: format!("{} (not a float tensor)", self.name),
                expected: vec![],
                got: self.shape.to_vec(),
            });
        };
        let mut out = vec![0f32; self.numel()];
        kvslim_kernels::quant::dequantize(dt, self.bytes, &mut out);
        Ok(out)
    }

    /// Converts an integer tensor to i64.
    pub fn to_i64(&self) -> Vec<i64> {
        match self.dtype {
            StDtype::I64 => {
                self.bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
            }
            StDtype::I32 => {
                self.bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64).collect()
            }
            _ => Vec::new(),
        }
    }
}

/// One or more mapped `.safetensors` files viewed as a single name → tensor map.
pub struct SafetensorsFiles {
    paths: Vec<PathBuf>,
    maps: Vec<Mmap>,
    tensors: HashMap<String, TensorInfo>,
}

impl SafetensorsFiles {
    /// Opens one file.
    pub fn open(path: &Path) -> Result<Self> {
        let mut s = SafetensorsFiles { paths: Vec::new(), maps: Vec::new(), tensors: HashMap::new() };
        s.add_file(path)?;
        Ok(s)
    }

    /// Opens `model.safetensors`, or every shard listed by
    /// `model.safetensors.index.json`, in directory `dir`.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let single = dir.join("model.safetensors");
        if single.exists() {
            return Self::open(&single);
        }
        let index = dir.join("model.safetensors.index.json");
        if !index.exists() {
            return Err(Error::format(dir, "no model.safetensors or model.safetensors.index.json"));
        }
        let text = std::fs::read(&index).map_err(|e| Error::io(&index, e))?;
        let v: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| Error::format(&index, format!("invalid JSON: {e}")))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::format(&index, "missing `weight_map` object"))?;
        let mut shards: Vec<&str> = map.values().filter_map(|f| f.as_str()).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut s = SafetensorsFiles { paths: Vec::new(), maps: Vec::new(), tensors: HashMap::new() };
        for shard in shards {
            if shard.contains('/') || shard.contains("..") {
                return Err(Error::format(&index, format!("shard name `{shard}` is not a plain file name")));
            }
            s.add_file(&dir.join(shard))?;
        }
        Ok(s)
    }

    fn add_file(&mut self, path: &Path) -> Result<()> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is opened read-only; kvslim never writes model files while reading them.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let bad = |why: String| Error::format(path, format!("invalid safetensors: {why}"));
        if map.len() < 8 {
            return Err(bad(format!("file is {} bytes, shorter than the 8-byte header length", map.len())));
        }
        let hlen = u64::from_le_bytes(map[..8].try_into().expect("8 bytes"));
        if hlen > (map.len() - 8) as u64 {
            return Err(bad(format!("header claims {hlen} bytes but the file has {}", map.len() - 8)));
        }
        let data_start = 8 + hlen as usize;
        let header: serde_json::Value =
            serde_json::from_slice(&map[8..data_start]).map_err(|e| bad(format!("header is not JSON: {e}")))?;
        let obj = header.as_object().ok_or_else(|| bad("header is not a JSON object".into()))?;
        let fidx = self.maps.len();
        for (name, info) in obj {
            if name == "__metadata__" {
                continue;
            }
            if !info.is_object() {
                return Err(bad(format!("tensor `{name}`: entry is not a JSON object")));
            }
            let Some(dt) = info.get("dtype").and_then(|d| d.as_str()) else {
                return Err(bad(format!("tensor `{name}` has no dtype")));
            };
            let dtype = StDtype::parse(dt).ok_or_else(|| Error::UnsupportedTensorType {
                path: path.into(),
                name: name.clone(),
                dtype: dt.to_string(),
            })?;
            let shape: Vec<usize> = info
                .get("shape")
                .and_then(|s| s.as_array())
                .map(|a| a.iter().map(|d| d.as_u64().map(|v| v as usize)).collect::<Option<Vec<_>>>())
                .and_then(|s| s)
                .ok_or_else(|| bad(format!("tensor `{name}` has no valid shape")))?;
            let offs = info
                .get("data_offsets")
                .and_then(|o| o.as_array())
                .filter(|o| o.len() == 2)
                .and_then(|o| Some((o[0].as_u64()? as usize, o[1].as_u64()? as usize)))
                .ok_or_else(|| bad(format!("tensor `{name}` has no valid data_offsets")))?;
            let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let want = numel.and_then(|n| n.checked_mul(dtype.size()));
            if offs.1 < offs.0 || Some(offs.1 - offs.0) != want {
                return Err(bad(format!(
                    "tensor `{name}` of shape {shape:?} {dt} spans bytes {}..{}, which does not match its size",
                    offs.0, offs.1
                )));
            }
            let (start, end) = match (data_start.checked_add(offs.0), data_start.checked_add(offs.1)) {
                (Some(s), Some(e)) if e <= map.len() => (s, e),
                _ => {
                    return Err(bad(format!(
                        "tensor `{name}` ends at byte {} but the file has {} bytes (truncated?)",
                        data_start as u128 + offs.1 as u128,
                        map.len()
                    )))
                }
            };
            self.tensors.insert(name.clone(), TensorInfo { dtype, shape, file: fidx, start, end });
        }
        self.paths.push(path.to_path_buf());
        self.maps.push(map);
        Ok(())
    }

    /// Tensor names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// A tensor by name.
    pub fn get(&self, name: &str) -> Result<RawTensor<'_>> {
        let (k, info) = self.tensors.get_key_value(name).ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        Ok(RawTensor {
            name: k,
            dtype: info.dtype,
            shape: &info.shape,
            bytes: &self.maps[info.file][info.start..info.end],
        })
    }

    /// Path of the file holding a tensor (for error messages).
    pub fn path_of(&self, name: &str) -> Option<&Path> {
        self.tensors.get(name).map(|i| self.paths[i.file].as_path())
    }

    /// First file's path.
    pub fn path(&self) -> &Path {
        &self.paths[0]
    }
}
