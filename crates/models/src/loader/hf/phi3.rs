//! Phi-3: Llama-style blocks whose Q/K/V (`qkv_proj`) and gate/up
//! (`gate_up_proj`) projections are each fused into one tensor, split by
//! rows at load; every layer is windowed when `sliding_window` is set.

use super::llama::{self, Flavour, Layout};
use super::reader::Reader;
use super::{Cfg, ConfigError};
use crate::config::{Architecture, ModelConfig};
use crate::weights::{Linear, Weights};
use crate::Result;
use kvslim_kernels::Matrix;

pub(super) fn config(j: &Cfg) -> Result<ModelConfig, ConfigError> {
    llama::config(j, &Flavour::plain(Architecture::Phi3, llama::all_local))
}

const LAYOUT: Layout = Layout { qkv: fused_qkv, gate_up: fused_gate_up, unit_offset_norms: false };

pub(super) fn weights(r: &Reader, c: &ModelConfig) -> Result<Weights> {
    llama::weights_in(r, c, &LAYOUT)
}

fn fused_qkv(r: &Reader, c: &ModelConfig, p: &str) -> Result<[Linear; 3]> {
    split_rows(r, &format!("{p}.self_attn.qkv_proj"), &[c.q_dim(), c.kv_dim(), c.kv_dim()], c.hidden_size)
}

fn fused_gate_up(r: &Reader, c: &ModelConfig, p: &str) -> Result<[Linear; 2]> {
    split_rows(r, &format!("{p}.mlp.gate_up_proj"), &[c.ffn_size, c.ffn_size], c.hidden_size)
}

/// A fused projection `prefix.weight` of `Σ parts` rows split into one
/// [`Linear`] per part.
fn split_rows<const N: usize>(r: &Reader, prefix: &str, parts: &[usize; N], inp: usize) -> Result<[Linear; N]> {
    let total: usize = parts.iter().sum();
    let (t, dt) = r.raw(&format!("{prefix}.weight"), &[total, inp])?;
    let bias = r.opt_vector(&format!("{prefix}.bias"), total)?;
    let row_bytes = dt.bytes_for(inp);
    let mut first = 0;
    let mut out = Vec::with_capacity(N);
    for &rows in parts {
        let bytes = &t.bytes[first * row_bytes..(first + rows) * row_bytes];
        let b = bias.as_ref().map(|b| b[first..first + rows].to_vec());
        out.push(Linear::new(Matrix::from_bytes(dt, rows, inp, bytes)?, b));
        first += rows;
    }
    Ok(out.try_into().unwrap_or_else(|_| unreachable!("one Linear per part")))
}
