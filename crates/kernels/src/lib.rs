//! Numeric kernels: the only place in kvslim that does arithmetic on raw
//! buffers. Everything above (models, cache, engine) calls into this crate and
//! never re-implements a loop over floats.
//!
//! * [`dtype`] — weight storage types (f32, f16, bf16, GGML Q8_0/Q4_0/Q4_1)
//! * [`dot`] — fused dequantize-dot products with runtime SIMD dispatch
//! * [`matrix`] — a weight matrix kept in its stored type; GEMV (decode) and
//!   GEMM (prefill), threaded with rayon
//! * [`int8`] — integer products for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and
//!   Q4_K/Q5_K/Q6_K: 8-bit activations,
//!   16-row weight panels, AVX-512 VNNI (the default for those formats)
//! * [`ops`] — norms, activations, softmax
//! * [`rope`] — rotary position embedding, both layouts, partial rotary
//! * [`attention`] — attention of a query-head group over cache slots
//! * [`kvquant`] — per-row codecs (f32/f16/q8/q4) for stored KV cache rows

pub mod attention;
pub mod dot;
pub mod dtype;
pub mod f16;
pub mod int8;
pub mod kvquant;
pub mod matrix;
pub mod ops;
pub mod quant;
pub mod rope;
mod simd;
#[cfg(test)]
mod test_util;

pub use dtype::DType;
pub use matrix::{Matrix, Products};

/// Errors raised when raw bytes cannot form the requested tensor.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("tensor of {rows}x{cols} {dtype} needs {expected} bytes, got {got}")]
    ByteLength { dtype: DType, rows: usize, cols: usize, expected: usize, got: usize },
    #[error("{dtype} rows must be a multiple of {block} elements, got a row of {cols}")]
    BlockAlignment { dtype: DType, block: usize, cols: usize },
}
