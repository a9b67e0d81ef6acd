//! GGUF v2/v3 reader (architectures in [`SUPPORTED_ARCHITECTURES`]).
//!
//! Layout of a GGUF file (all little-endian):
//!
//! ```text
//! "GGUF" u32:version u64:tensor_count u64:kv_count
//! kv_count × { string:key u32:value_type value }
//! tensor_count × { string:name u32:n_dims n_dims×u64:ne u32:ggml_type u64:offset }
//! padding to `general.alignment` (default 32)
//! tensor data (each tensor at data_start + offset)
//! ```
//!
//! Strings are a u64 byte length followed by UTF-8 bytes (no terminator);
//! arrays are a u32 element type, a u64 count and the elements. `ne[0]` is
//! the innermost (column) dimension, so a weight matrix of `rows × cols` has
//! `ne = [cols, rows]`.
//!
//! Nothing in the file is trusted: every count, length, dimension and offset
//! is checked against the bytes that remain before it is used, so a
//! truncated or lying file gives an [`Error`], never a panic or a huge
//! allocation.

use super::LoadedModel;
use crate::config::{Architecture, BlockFeatures, ModelConfig, NormKind, RopeConfig, SlidingWindow, SourceFormat};
use crate::transformer::Model;
use crate::weights::{LayerWeights, Linear, NormWeights, Weights};
use crate::{Error, Result};
use kvslim_kernels::ops::Activation;
use kvslim_kernels::rope::RopeLayout;
use kvslim_kernels::{DType, Matrix};
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// GGML's maximum number of tensor dimensions.
const MAX_DIMS: usize = 4;
/// Arrays of arrays are legal; deeper nesting than this is refused so a
/// hostile file cannot exhaust the stack.
const MAX_ARRAY_DEPTH: usize = 4;

/// GGUF metadata value types (the u32 tag in the file).
mod vt {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// GGUF's name of the value type.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "uint8",
            Value::I8(_) => "int8",
            Value::U16(_) => "uint16",
            Value::I16(_) => "int16",
            Value::U32(_) => "uint32",
            Value::I32(_) => "int32",
            Value::F32(_) => "float32",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "uint64",
            Value::I64(_) => "int64",
            Value::F64(_) => "float64",
        }
    }

    /// Any integer value as i64 (u64 above i64::MAX is `None`).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(v) => v as i64,
            Value::I8(v) => v as i64,
            Value::U16(v) => v as i64,
            Value::I16(v) => v as i64,
            Value::U32(v) => v as i64,
            Value::I32(v) => v as i64,
            Value::U64(v) => i64::try_from(v).ok()?,
            Value::I64(v) => v,
            _ => return None,
        })
    }

    /// Any numeric value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            Value::U64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The key/value metadata of a GGUF file, with typed getters that turn a
/// value of the wrong type into an [`Error`] naming the key.
#[derive(Debug)]
pub struct Metadata {
    path: PathBuf,
    entries: HashMap<String, Value>,
    /// Keys in file order (for listings).
    order: Vec<String>,
}

impl Metadata {
    /// The file the metadata came from (for error messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.get(key)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    /// Keys in the order the file lists them.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(String::as_str)
    }

    fn wrong_type(&self, key: &str, want: &str, v: &Value) -> Error {
        Error::format(&self.path, format!("metadata key `{key}` should be {want} but is {}", v.type_name()))
    }

    /// A string value (`None` when absent).
    pub fn str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.wrong_type(key, "a string", v)),
        }
    }

    /// A non-negative integer value of any integer type.
    pub fn usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .and_then(|i| usize::try_from(i).ok())
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "a non-negative integer", v)),
        }
    }

    /// A numeric value as f32.
    pub fn f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(|f| Some(f as f32)).ok_or_else(|| self.wrong_type(key, "a number", v)),
        }
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.wrong_type(key, "a bool", v)),
        }
    }

    /// An array value (`None` when absent).
    pub fn array(&self, key: &str) -> Result<Option<&[Value]>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| self.wrong_type(key, "an array", v)),
        }
    }

    /// An array of strings.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<&str>>> {
        let Some(a) = self.array(key)? else {
            return Ok(None);
        };
        a.iter()
            .map(|v| v.as_str().ok_or_else(|| self.wrong_type(key, "an array of strings", v)))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// An array of numbers as f32.
    pub fn f32s(&self, key: &str) -> Result<Option<Vec<f32>>> {
        let Some(a) = self.array(key)? else {
            return Ok(None);
        };
        a.iter()
            .map(|v| v.as_f64().map(|f| f as f32).ok_or_else(|| self.wrong_type(key, "an array of numbers", v)))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// An array of integers.
    pub fn i64s(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(a) = self.array(key)? else {
            return Ok(None);
        };
        a.iter()
            .map(|v| v.as_i64().ok_or_else(|| self.wrong_type(key, "an array of integers", v)))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// The storage types kvslim reads from GGUF, named in the error for the rest.
const SUPPORTED_GGML_TYPES: &str = "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k";

/// GGML tensor type ids and names: the ids with a kvslim storage type map
/// to it; every other known id is refused by name (e.g. `iq2_xxs`), so a
/// user sees which quantization their file uses and which ones would load.
fn ggml_type(id: u32) -> std::result::Result<DType, String> {
    Ok(match id {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::Q4_0,
        3 => DType::Q4_1,
        6 => DType::Q5_0,
        7 => DType::Q5_1,
        8 => DType::Q8_0,
        10 => DType::Q2_K,
        11 => DType::Q3_K,
        12 => DType::Q4_K,
        13 => DType::Q5_K,
        14 => DType::Q6_K,
        30 => DType::BF16,
        _ => {
            let name = match id {
                9 => "q8_1",
                15 => "q8_k",
                16 => "iq2_xxs",
                17 => "iq2_xs",
                18 => "iq3_xxs",
                19 => "iq1_s",
                20 => "iq4_nl",
                21 => "iq3_s",
                22 => "iq2_s",
                23 => "iq4_xs",
                24 => "i8",
                25 => "i16",
                26 => "i32",
                27 => "i64",
                28 => "f64",
                29 => "iq1_m",
                34 => "tq1_0",
                35 => "tq2_0",
                39 => "mxfp4",
                _ => return Err(format!("unknown GGML type id {id} (supported: {SUPPORTED_GGML_TYPES})")),
            };
            return Err(format!("{name} (GGML type id {id}; supported: {SUPPORTED_GGML_TYPES})"));
        }
    })
}

/// Where one tensor lives in the file.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the innermost (column) dimension.
    pub dims: Vec<usize>,
    pub dtype: DType,
    /// Absolute byte offset of the data in the file.
    pub start: usize,
    /// Data length in bytes.
    pub nbytes: usize,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    pub version: u32,
    pub metadata: Metadata,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    /// Alignment of the data section and of every tensor offset.
    pub alignment: usize,
    /// Absolute offset of the data section.
    pub data_start: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GgufFile({}, v{}, {} keys, {} tensors)",
            self.path.display(),
            self.version,
            self.metadata.entries.len(),
            self.tensors.len()
        )
    }
}

/// Bounds-checked little-endian cursor over the file's bytes.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn err(&self, why: String) -> Error {
        Error::format(self.path, format!("invalid GGUF: {why}"))
    }

    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "file truncated: {} needs {n} bytes at offset {} but the file has {} bytes",
                what(),
                self.pos,
                self.data.len()
            )));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        Ok(s.try_into().expect("took N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u64 count that must fit in what is left of the file at
    /// `min_bytes` per item.
    fn count(&mut self, min_bytes: usize, what: &dyn Fn() -> String) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let fits = usize::try_from(n).ok().filter(|&n| n.checked_mul(min_bytes).is_some_and(|b| b <= self.remaining()));
        fits.ok_or_else(|| {
            self.err(format!(
                "{} claims {n} items (at offset {at}), but only {} bytes follow in the file \
                 (at least {min_bytes} per item): truncated or corrupt file",
                what(),
                self.remaining()
            ))
        })
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(self.err(format!(
                "{} has a string length of {len} bytes (at offset {at}), but only {} bytes \
                 follow in the file: truncated or corrupt file",
                what(),
                self.remaining()
            )));
        }
        let bytes = self.take(len as usize, what)?;
        Ok(match std::str::from_utf8(bytes) {
            Ok(s) => s.to_owned(),
            Err(_) => String::from_utf8_lossy(bytes).into_owned(),
        })
    }

    /// Minimum encoded size of one value of type `t` (for count checks).
    fn min_size(t: u32) -> usize {
        match t {
            vt::U8 | vt::I8 | vt::BOOL => 1,
            vt::U16 | vt::I16 => 2,
            vt::U32 | vt::I32 | vt::F32 => 4,
            vt::U64 | vt::I64 | vt::F64 | vt::STRING => 8,
            _ => 12, // array: type + count
        }
    }

    fn value(&mut self, t: u32, depth: usize, what: &dyn Fn() -> String) -> Result<Value> {
        Ok(match t {
            vt::U8 => Value::U8(self.array::<1>(what)?[0]),
            vt::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            vt::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            vt::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            vt::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            vt::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            vt::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            vt::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            vt::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            vt::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            vt::BOOL => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("{} has invalid bool byte {b}", what()))),
            },
            vt::STRING => Value::Str(self.string(what)?),
            vt::ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!("{} nests arrays deeper than {MAX_ARRAY_DEPTH} levels", what())));
                }
                let et = self.u32(what)?;
                if et > vt::F64 {
                    return Err(self.err(format!("{} is an array of unknown value type {et}", what())));
                }
                let n = self.count(Self::min_size(et), what)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(et, depth + 1, what)?);
                }
                Value::Array(items)
            }
            _ => return Err(self.err(format!("{} has unknown value type {t}", what()))),
        })
    }
}

impl GgufFile {
    /// Maps and parses a GGUF file; every tensor's extent is validated.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is opened read-only; kvslim never writes model
        // files while reading them.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let header = parse(path, &map)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            version: header.version,
            metadata: header.metadata,
            index: header.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect(),
            tensors: header.tensors,
            alignment: header.alignment,
            data_start: header.data_start,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (bounds were checked when parsing).
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        &self.map[t.start..t.start + t.nbytes]
    }
}

/// Parses and validates a GGUF image held in memory (header, metadata,
/// tensor table, every tensor's extent) without touching the disk: the
/// entry point of the fuzz tests. Returns the metadata key count and the
/// tensor count.
pub fn check_bytes(data: &[u8]) -> Result<(usize, usize)> {
    let h = parse(Path::new("<memory>"), data)?;
    Ok((h.metadata.entries.len(), h.tensors.len()))
}

struct Header {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    alignment: usize,
    data_start: usize,
}

fn parse(path: &Path, data: &[u8]) -> Result<Header> {
    let mut r = Reader { data, pos: 0, path };
    let magic = r.take(4, &|| "the magic".into())?;
    if magic != b"GGUF" {
        return Err(r.err(format!("bad magic {magic:02x?}, expected \"GGUF\"")));
    }
    let version = r.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(r.err(
                "GGUF version 1 is not supported (only v2 and v3); re-convert the model with a \
                 current llama.cpp"
                    .into(),
            ))
        }
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(r.err("big-endian GGUF files are not supported".into()))
        }
        v => return Err(r.err(format!("unsupported GGUF version {v} (only v2 and v3)"))),
    }
    // minimum sizes: a tensor info is name length + n_dims + type + offset,
    // a metadata entry is key length + type + a 1-byte value
    let n_tensors = r.count(8 + 4 + 4 + 8, &|| "the tensor count".into())?;
    let n_kv = r.count(8 + 4 + 1, &|| "the metadata count".into())?;

    let mut entries = HashMap::with_capacity(n_kv);
    let mut order = Vec::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = r.string(&|| format!("metadata entry {i} key"))?;
        let what = || format!("metadata key `{key}`");
        let t = r.u32(&what)?;
        let v = r.value(t, 0, &what)?;
        if entries.insert(key.clone(), v).is_some() {
            return Err(r.err(format!("metadata key `{key}` appears twice")));
        }
        order.push(key);
    }
    let metadata = Metadata { path: path.to_path_buf(), entries, order };

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_i64() {
            Some(a) if a > 0 && a <= 1 << 20 && (a as u64).is_power_of_two() => a as usize,
            _ => return Err(r.err(format!("general.alignment {v:?} is not a power of two between 1 and 2^20"))),
        },
    };

    struct Raw {
        name: String,
        dims: Vec<usize>,
        dtype: DType,
        offset: u64,
    }
    let mut raws = Vec::with_capacity(n_tensors);
    let mut seen = std::collections::HashSet::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = r.string(&|| format!("tensor info {i} name"))?;
        let what = || format!("tensor `{name}`");
        let n_dims = r.u32(&what)? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(r.err(format!("tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            let d = r.u64(&what)?;
            // a dimension can never exceed the file's size in elements
            if d > data.len() as u64 * 2 {
                return Err(r.err(format!(
                    "tensor `{name}` claims a dimension of {d}, more than the {}-byte file can \
                     hold (truncated or corrupt file)",
                    data.len()
                )));
            }
            dims.push(d as usize);
        }
        let type_id = r.u32(&what)?;
        let dtype = ggml_type(type_id).map_err(|dtype| Error::UnsupportedTensorType {
            path: path.to_path_buf(),
            name: name.clone(),
            dtype,
        })?;
        let offset = r.u64(&what)?;
        if !seen.insert(name.clone()) {
            return Err(r.err(format!("tensor `{name}` is listed twice")));
        }
        raws.push(Raw { name, dims, dtype, offset });
    }

    let data_start = r.pos.div_ceil(alignment) * alignment;
    let mut tensors = Vec::with_capacity(raws.len());
    for raw in raws {
        let name = raw.name;
        let block = raw.dtype.block_elems();
        if !raw.dims[0].is_multiple_of(block) {
            return Err(r.err(format!(
                "tensor `{name}`: row length {} is not a multiple of the {} block size {block}",
                raw.dims[0], raw.dtype
            )));
        }
        let numel = raw.dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let nbytes = numel.and_then(|n| (n / block).checked_mul(raw.dtype.block_bytes())).filter(|&b| b <= data.len());
        let Some(nbytes) = nbytes else {
            return Err(r.err(format!(
                "tensor `{name}` of dims {:?} {} is larger than the whole {}-byte file \
                 (truncated or corrupt file)",
                raw.dims,
                raw.dtype,
                data.len()
            )));
        };
        if !raw.offset.is_multiple_of(alignment as u64) {
            return Err(r.err(format!(
                "tensor `{name}` data offset {} is not a multiple of the alignment {alignment}",
                raw.offset
            )));
        }
        let start = usize::try_from(raw.offset).ok().and_then(|o| o.checked_add(data_start));
        let end = start.and_then(|s| s.checked_add(nbytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= data.len() => {
                tensors.push(TensorInfo { name, dims: raw.dims, dtype: raw.dtype, start, nbytes })
            }
            _ => {
                return Err(r.err(format!(
                    "tensor `{name}` data ({nbytes} bytes at data offset {}, data section at \
                     byte {data_start}) extends past the end of the {}-byte file (truncated?)",
                    raw.offset,
                    data.len()
                )))
            }
        }
    }
    Ok(Header { version, metadata, tensors, alignment, data_start })
}

/// Loads a GGUF model with its embedded tokenizer.
pub fn load(path: &Path) -> Result<LoadedModel> {
    let file = GgufFile::open(path)?;
    let (config, weights) = build(&file)?;
    let tokenizer =
        crate::tokenizer::gguf::from_metadata(&file.metadata, config.bos_token_id, config.eos_token_ids.clone())?;
    if let Some(t) = &tokenizer {
        if t.vocab_size() > config.vocab_size {
            return Err(Error::format(
                path,
                format!(
                    "the tokenizer has {} tokens but token_embd.weight only {} rows",
                    t.vocab_size(),
                    config.vocab_size
                ),
            ));
        }
    }
    Ok(LoadedModel { model: Model::new(config, weights)?, tokenizer })
}

/// The GGUF architectures kvslim maps onto its forward pass.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "gemma3", "phi3"];

/// Gemma 3 files without `gemma3.attention.sliding_window_pattern` (every
/// real one) make every 6th layer global, as llama.cpp does.
const GEMMA3_GLOBAL_EVERY: usize = 6;
/// Gemma 3's RoPE base on local layers when the file does not say.
const GEMMA3_LOCAL_ROPE_BASE: f32 = 10_000.0;

/// Translates a parsed file's metadata and tensors into a config and
/// weights. Each supported `general.architecture` differs only in
/// [`ModelConfig`] flags and in how tensors are named or fused:
///
/// | arch | differences from `llama` |
/// |---|---|
/// | `qwen2` | q/k/v biases, NEOX RoPE (rotate halves) |
/// | `qwen3` | per-head RMS norm of q and k before RoPE, NEOX RoPE |
/// | `gemma3` | QK norm, norms after attention and MLP, GeGLU (tanh), embeddings × √d, sliding-window layers with their own RoPE base, NEOX RoPE |
/// | `phi3` | fused `attn_qkv` and gate/up `ffn_up`, NEOX RoPE, optional sliding window |
///
/// Tensors of `llama` GGUFs are permuted by the converter so RoPE rotates
/// adjacent pairs; the other converters keep the original order.
pub fn build(f: &GgufFile) -> Result<(ModelConfig, Weights)> {
    let md = &f.metadata;
    let path = f.path();
    let arch_name = md
        .str("general.architecture")?
        .ok_or_else(|| Error::format(path, "metadata key `general.architecture` is missing"))?;
    let architecture = match arch_name {
        "llama" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "qwen3" => Architecture::Qwen3,
        "gemma3" => Architecture::Gemma3,
        "phi3" => Architecture::Phi3,
        other => return Err(Error::UnknownArchitecture(format!("gguf {other}"))),
    };
    let a = arch_name;
    let key = |k: &str| format!("{a}.{k}");
    let required = |k: &str| -> Result<usize> {
        let k = key(k);
        md.usize(&k)?.ok_or_else(|| Error::format(path, format!("metadata key `{k}` is missing")))
    };
    let n_layers = required("block_count")?;
    let hidden = required("embedding_length")?;
    let ffn = required("feed_forward_length")?;
    let n_heads = required("attention.head_count")?;
    let context_len = required("context_length")?;
    let n_kv_heads = md.usize(&key("attention.head_count_kv"))?.unwrap_or(n_heads);
    if n_heads == 0 || n_kv_heads == 0 {
        return Err(Error::format(path, "attention head counts must be positive"));
    }
    let head_dim = match md.usize(&key("attention.key_length"))? {
        Some(k) => k,
        None => {
            if !hidden.is_multiple_of(n_heads) {
                return Err(Error::format(
                    path,
                    format!("embedding_length {hidden} is not a multiple of head_count {n_heads}"),
                ));
            }
            hidden / n_heads
        }
    };
    if let Some(vl) = md.usize(&key("attention.value_length"))? {
        if vl != head_dim {
            return Err(Error::format(
                path,
                format!("attention.value_length {vl} differs from key_length {head_dim}: not supported"),
            ));
        }
    }
    let rotary_dim = md.usize(&key("rope.dimension_count"))?.unwrap_or(head_dim);
    let theta = md.f32(&key("rope.freq_base"))?.unwrap_or(10000.0);
    let norm_eps = md.f32(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5);
    if let Some(kind) = md.str(&key("rope.scaling.type"))? {
        let factor = md.f32(&key("rope.scaling.factor"))?.unwrap_or(1.0);
        if kind != "none" && factor != 1.0 {
            return Err(Error::format(path, format!("RoPE scaling `{kind}` (factor {factor}) is not supported")));
        }
    }
    for t in ["rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"] {
        if f.tensor(t).is_some() {
            return Err(Error::format(
                path,
                format!("per-dimension RoPE frequency factors (`{t}`, Llama 3.1 / Phi-3 long-context style) are not supported"),
            ));
        }
    }
    let gemma = architecture == Architecture::Gemma3;
    let sliding_window = match md.usize(&key("attention.sliding_window"))? {
        None | Some(0) => None,
        Some(window) => {
            let local_layers = match md.array(&key("attention.sliding_window_pattern"))? {
                Some(pattern) => {
                    let flags: Option<Vec<bool>> = pattern.iter().map(Value::as_bool).collect();
                    match flags {
                        Some(f) if f.len() == n_layers => f,
                        _ => {
                            return Err(Error::format(
                                path,
                                format!(
                                    "`{}` must hold one bool per layer ({n_layers})",
                                    key("attention.sliding_window_pattern")
                                ),
                            ))
                        }
                    }
                }
                None if gemma => (0..n_layers).map(|l| l % GEMMA3_GLOBAL_EVERY < GEMMA3_GLOBAL_EVERY - 1).collect(),
                None => vec![true; n_layers],
            };
            let local_rope_theta =
                if gemma { Some(md.f32(&key("rope.freq_base_swa"))?.unwrap_or(GEMMA3_LOCAL_ROPE_BASE)) } else { None };
            Some(SlidingWindow { window, local_layers, local_rope_theta })
        }
    };
    let qk_norm = matches!(architecture, Architecture::Qwen3 | Architecture::Gemma3);
    let features = BlockFeatures {
        qk_norm,
        post_norms: gemma,
        embedding_scale: gemma.then(|| (hidden as f32).sqrt()),
        attention_scale: None,
        sliding_window,
    };
    let layout = if architecture == Architecture::Llama { RopeLayout::AdjacentPairs } else { RopeLayout::HalfSplit };

    let tensor =
        |name: &str| -> Result<&TensorInfo> { f.tensor(name).ok_or_else(|| Error::MissingTensor(name.to_string())) };
    let embd = tensor("token_embd.weight")?;
    let vocab_size = match embd.dims.as_slice() {
        [_, rows] => *rows,
        _ => 0,
    };
    let mut config = ModelConfig {
        architecture,
        format: SourceFormat::Gguf,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        hidden_size: hidden,
        ffn_size: ffn,
        vocab_size,
        context_len,
        norm: NormKind::Rms,
        norm_eps,
        activation: if gemma { Activation::GeluTanh } else { Activation::Silu },
        gated_mlp: true,
        rope: Some(RopeConfig { theta, rotary_dim, layout }),
        learned_positions: None,
        parallel_residual: false,
        tied_embeddings: f.tensor("output.weight").is_none(),
        bos_token_id: None,
        eos_token_ids: Vec::new(),
        features,
    };
    config.validate().map_err(|why| Error::format(path, format!("invalid {a} config: {why}")))?;

    // a matrix of `rows × cols`, or rows `first..first + rows` of a fused one
    let matrix_rows = |name: &str, total_rows: usize, first: usize, rows: usize, cols: usize| -> Result<Matrix> {
        let t = tensor(name)?;
        if t.dims != [cols, total_rows] {
            return Err(Error::ShapeMismatch {
                name: format!("{name} (GGUF ne order: columns, rows)"),
                expected: vec![cols, total_rows],
                got: t.dims.clone(),
            });
        }
        if !cols.is_multiple_of(t.dtype.block_elems()) {
            return Err(Error::format(
                path,
                format!(
                    "tensor `{name}`: rows of {cols} are not whole {} blocks of {}",
                    t.dtype,
                    t.dtype.block_elems()
                ),
            ));
        }
        let rb = t.dtype.bytes_for(cols);
        let bytes = &f.data(t)[first * rb..(first + rows) * rb];
        Matrix::from_bytes(t.dtype, rows, cols, bytes).map_err(|e| Error::format(path, format!("tensor `{name}`: {e}")))
    };
    let matrix = |name: &str, rows: usize, cols: usize| matrix_rows(name, rows, 0, rows, cols);
    let vector = |name: &str, len: usize| -> Result<Vec<f32>> {
        let t = tensor(name)?;
        if t.dims != [len] {
            return Err(Error::ShapeMismatch { name: name.to_string(), expected: vec![len], got: t.dims.clone() });
        }
        let mut w = vec![0f32; len];
        kvslim_kernels::quant::dequantize(t.dtype, f.data(t), &mut w);
        Ok(w)
    };
    let norm_of =
        |name: &str, len: usize| -> Result<NormWeights> { Ok(NormWeights { weight: vector(name, len)?, bias: None }) };
    let optional_bias = |name: &str, len: usize| -> Result<Option<Vec<f32>>> {
        if f.tensor(name).is_some() {
            vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    };

    let (q_dim, kv_dim) = (config.q_dim(), config.kv_dim());
    let token_embedding = matrix("token_embd.weight", vocab_size, hidden)?;
    let mut layers = Vec::with_capacity(n_layers);
    for i in 0..n_layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        let b = |s: &str| format!("blk.{i}.{s}.bias");
        let lin = |s: &str, rows, cols| -> Result<Linear> {
            Ok(Linear::new(matrix(&n(s), rows, cols)?, optional_bias(&b(s), rows)?))
        };
        let (q, k, v) = if architecture == Architecture::Phi3 {
            let total = q_dim + 2 * kv_dim;
            let part = |first, rows| -> Result<Linear> {
                Ok(Linear::new(matrix_rows(&n("attn_qkv"), total, first, rows, hidden)?, None))
            };
            (part(0, q_dim)?, part(q_dim, kv_dim)?, part(q_dim + kv_dim, kv_dim)?)
        } else {
            (lin("attn_q", q_dim, hidden)?, lin("attn_k", kv_dim, hidden)?, lin("attn_v", kv_dim, hidden)?)
        };
        let (gate, up) = if architecture == Architecture::Phi3 {
            let part = |first| -> Result<Linear> {
                Ok(Linear::new(matrix_rows(&n("ffn_up"), 2 * ffn, first, ffn, hidden)?, None))
            };
            (part(0)?, part(ffn)?)
        } else {
            (lin("ffn_gate", ffn, hidden)?, lin("ffn_up", ffn, hidden)?)
        };
        let pair = |on: bool, a: &str, b: &str, len| -> Result<(Option<NormWeights>, Option<NormWeights>)> {
            Ok(if on { (Some(norm_of(&n(a), len)?), Some(norm_of(&n(b), len)?)) } else { (None, None) })
        };
        let (q_norm, k_norm) = pair(qk_norm, "attn_q_norm", "attn_k_norm", head_dim)?;
        let (post_attn_norm, post_mlp_norm) = pair(gemma, "post_attention_norm", "post_ffw_norm", hidden)?;
        layers.push(LayerWeights {
            attn_norm: norm_of(&n("attn_norm"), hidden)?,
            q,
            k,
            v,
            o: lin("attn_output", hidden, q_dim)?,
            mlp_norm: norm_of(&n("ffn_norm"), hidden)?,
            gate: Some(gate),
            up,
            down: lin("ffn_down", hidden, ffn)?,
            q_norm,
            k_norm,
            post_attn_norm,
            post_mlp_norm,
        });
    }
    let final_norm = norm_of("output_norm.weight", hidden)?;
    let lm_head = if config.tied_embeddings {
        None
    } else {
        Some(Linear::new(matrix("output.weight", vocab_size, hidden)?, None))
    };

    // special tokens
    let token_id = |key: &str| -> Result<Option<u32>> {
        match md.usize(key)? {
            None => Ok(None),
            Some(id) if id < vocab_size => Ok(Some(id as u32)),
            Some(id) => {
                Err(Error::format(path, format!("`{key}` = {id} is outside the vocabulary of {vocab_size} tokens")))
            }
        }
    };
    config.bos_token_id = token_id("tokenizer.ggml.bos_token_id")?;
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = token_id(key)? {
            if !config.eos_token_ids.contains(&id) {
                config.eos_token_ids.push(id);
            }
        }
    }

    Ok((config, Weights { token_embedding, position_embedding: None, layers, final_norm, lm_head }))
}
