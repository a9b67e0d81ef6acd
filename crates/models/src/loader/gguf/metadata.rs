//! GGUF metadata: the typed key/value pairs at the head of a file, read by
//! the parser beside it and by the tokenizer and architectures that
//! interpret them.

use crate::{Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// GGUF metadata value types (the u32 tag in the file).
pub(super) mod vt {
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
    /// The value type's tag in the file.
    pub fn tag(&self) -> u32 {
        match self {
            Value::U8(_) => vt::U8,
            Value::I8(_) => vt::I8,
            Value::U16(_) => vt::U16,
            Value::I16(_) => vt::I16,
            Value::U32(_) => vt::U32,
            Value::I32(_) => vt::I32,
            Value::F32(_) => vt::F32,
            Value::Bool(_) => vt::BOOL,
            Value::Str(_) => vt::STRING,
            Value::Array(_) => vt::ARRAY,
            Value::U64(_) => vt::U64,
            Value::I64(_) => vt::I64,
            Value::F64(_) => vt::F64,
        }
    }

    /// GGUF's name of the value type.
    pub fn type_name(&self) -> &'static str {
        const NAMES: [&str; 13] = [
            "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64",
            "int64", "float64",
        ];
        NAMES[self.tag() as usize]
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
    pub(super) path: PathBuf,
    pub(super) entries: HashMap<String, Value>,
    /// Keys in file order (for listings).
    pub(super) order: Vec<String>,
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

    /// The value of `key` as `get` reads it (`None` when absent); a value
    /// `get` refuses is an error saying it should be `want`.
    fn typed<'a, T>(&'a self, key: &str, want: &str, get: impl Fn(&'a Value) -> Option<T>) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => get(v).map(Some).ok_or_else(|| self.wrong_type(key, want, v)),
        }
    }

    /// The array of `key` with every element as `get` reads it.
    fn typed_array<'a, T>(
        &'a self,
        key: &str,
        want: &str,
        get: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Option<Vec<T>>> {
        let Some(a) = self.array(key)? else {
            return Ok(None);
        };
        a.iter().map(|v| get(v).ok_or_else(|| self.wrong_type(key, want, v))).collect::<Result<Vec<_>>>().map(Some)
    }

    /// A string value (`None` when absent).
    pub fn str(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "a string", Value::as_str)
    }

    /// A non-negative integer value of any integer type.
    pub fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.typed(key, "a non-negative integer", |v| v.as_i64().and_then(|i| usize::try_from(i).ok()))
    }

    /// A numeric value as f32.
    pub fn f32(&self, key: &str) -> Result<Option<f32>> {
        self.typed(key, "a number", |v| v.as_f64().map(|f| f as f32))
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", Value::as_bool)
    }

    /// An array value (`None` when absent).
    pub fn array(&self, key: &str) -> Result<Option<&[Value]>> {
        self.typed(key, "an array", Value::as_array)
    }

    /// An array of strings.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<&str>>> {
        self.typed_array(key, "an array of strings", Value::as_str)
    }

    /// An array of numbers as f32.
    pub fn f32s(&self, key: &str) -> Result<Option<Vec<f32>>> {
        self.typed_array(key, "an array of numbers", |v| v.as_f64().map(|f| f as f32))
    }

    /// An array of integers.
    pub fn i64s(&self, key: &str) -> Result<Option<Vec<i64>>> {
        self.typed_array(key, "an array of integers", Value::as_i64)
    }
}
