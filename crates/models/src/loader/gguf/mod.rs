//! GGUF v2/v3 reader; [`build`] turns a file into a model (one file per
//! architecture beside it: `llama.rs`, `qwen2.rs`, …).
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

mod arch;
mod build;
mod gemma3;
mod llama;
pub mod metadata;
mod phi3;
mod qwen2;
mod qwen3;

pub use build::{build, supported_architectures};
use metadata::vt;
pub use metadata::{Metadata, Value};

use super::LoadedModel;
use crate::transformer::Model;
use crate::{Error, Result};
use kvslim_kernels::DType;
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
