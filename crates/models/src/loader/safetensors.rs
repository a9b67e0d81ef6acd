//! `.safetensors` reader: the header is parsed and every tensor's dtype,
//! shape and offsets checked against the mapped file by the `safetensors`
//! crate before any byte is read. Also reads sharded checkpoints through
//! `model.safetensors.index.json`. When the crate rejects a file, the
//! header is looked at once more to name the problem and the tensor.

use crate::{Error, Result};
use kvslim_kernels::DType;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
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
    fn from_dtype(d: Dtype) -> Option<Self> {
        Some(match d {
            Dtype::F32 => StDtype::F32,
            Dtype::F16 => StDtype::F16,
            Dtype::BF16 => StDtype::BF16,
            Dtype::I64 => StDtype::I64,
            Dtype::I32 => StDtype::I32,
            Dtype::F64 => StDtype::F64,
            _ => return None,
        })
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
        let (hlen, meta) = SafeTensors::read_metadata(&map).map_err(|e| diagnose(path, &map, e))?;
        let data_start = 8 + hlen;
        let fidx = self.maps.len();
        for (name, info) in meta.tensors() {
            let dtype = StDtype::from_dtype(info.dtype).ok_or_else(|| Error::UnsupportedTensorType {
                path: path.into(),
                name: name.clone(),
                dtype: info.dtype.to_string(),
            })?;
            let (start, end) = (data_start + info.data_offsets.0, data_start + info.data_offsets.1);
            self.tensors.insert(name, TensorInfo { dtype, shape: info.shape.clone(), file: fidx, start, end });
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

/// Why the `safetensors` crate rejected `map`, named as precisely as the
/// header allows: the framing (file shorter than the length, header longer
/// than the file, not JSON, not an object), else the first tensor whose
/// entry is malformed, whose type kvslim cannot read, whose byte span
/// disagrees with its shape or lies past the end of the file; else the
/// crate's own reason (overlapping or uncovered spans, a header too large).
fn diagnose(path: &Path, map: &[u8], e: safetensors::SafeTensorError) -> Error {
    let bad = |why: String| Error::format(path, format!("invalid safetensors: {why}"));
    if map.len() < 8 {
        return bad(format!("file is {} bytes, shorter than the 8-byte header length", map.len()));
    }
    let hlen = u64::from_le_bytes(map[..8].try_into().expect("8 bytes"));
    if hlen > (map.len() - 8) as u64 {
        return bad(format!("header claims {hlen} bytes but the file has {}", map.len() - 8));
    }
    let data_start = 8 + hlen as usize;
    let header: Value = match serde_json::from_slice(&map[8..data_start]) {
        Ok(v) => v,
        Err(e) => return bad(format!("header is not JSON: {e}")),
    };
    let Some(obj) = header.as_object() else { return bad("header is not a JSON object".into()) };
    for (name, entry) in obj.iter().filter(|(n, _)| *n != "__metadata__") {
        let Some(fields) = entry.as_object() else {
            return bad(format!("tensor `{name}`: entry is not a JSON object"));
        };
        let Some(dt) = fields.get("dtype").and_then(Value::as_str) else {
            return bad(format!("tensor `{name}` has no dtype"));
        };
        let Some(dtype) =
            serde_json::from_value::<Dtype>(Value::from(dt)).ok().filter(|d| StDtype::from_dtype(*d).is_some())
        else {
            return Error::UnsupportedTensorType { path: path.into(), name: name.clone(), dtype: dt.to_string() };
        };
        let field = |key: &str| fields.get(key).cloned().unwrap_or(Value::Null);
        let Ok(shape) = serde_json::from_value::<Vec<usize>>(field("shape")) else {
            return bad(format!("tensor `{name}` has no valid shape"));
        };
        let Ok((s, e)) = serde_json::from_value::<(usize, usize)>(field("data_offsets")) else {
            return bad(format!("tensor `{name}` has no valid data_offsets"));
        };
        let bytes =
            shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).and_then(|n| n.checked_mul(dtype.bitsize() / 8));
        if e < s || Some(e - s) != bytes {
            return bad(format!(
                "tensor `{name}` of shape {shape:?} {dt} spans bytes {s}..{e}, which does not match its size"
            ));
        }
        if data_start.checked_add(e).is_none_or(|end| end > map.len()) {
            return bad(format!(
                "tensor `{name}` ends at byte {} but the file has {} bytes (truncated?)",
                data_start as u128 + e as u128,
                map.len()
            ));
        }
    }
    match e {
        safetensors::SafeTensorError::InvalidOffset(_) | safetensors::SafeTensorError::MetadataIncompleteBuffer => {
            bad(format!(
                "{e} (the tensors' byte spans must follow each other and cover the data, without gaps or overlaps)"
            ))
        }
        e => bad(e.to_string()),
    }
}
