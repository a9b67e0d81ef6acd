//! Reading named tensors out of safetensors files with the shape the
//! config implies, so a mismatch is reported at the tensor, by name.

use crate::loader::safetensors::{RawTensor, SafetensorsFiles};
use crate::weights::{Linear, NormWeights};
use crate::{Error, Result};
use kvslim_kernels::{DType, Matrix};

/// Reads tensors by name, checking shapes.
pub(super) struct Reader<'a> {
    files: &'a SafetensorsFiles,
}

impl<'a> Reader<'a> {
    pub(super) fn new(files: &'a SafetensorsFiles) -> Self {
        Reader { files }
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.files.contains(name)
    }

    /// The tensor `name` with exactly `shape`, in a weight type kvslim reads.
    pub(super) fn raw(&self, name: &str, shape: &[usize]) -> Result<(RawTensor<'_>, DType)> {
        let t = self.files.get(name)?;
        if t.shape != shape {
            return Err(Error::ShapeMismatch { name: name.into(), expected: shape.to_vec(), got: t.shape.to_vec() });
        }
        let Some(dt) = t.dtype.weight_dtype() else {
            return Err(Error::UnsupportedTensorType {
                path: self.files.path_of(name).unwrap_or(self.files.path()).into(),
                name: name.into(),
                dtype: format!("{:?}", t.dtype),
            });
        };
        Ok((t, dt))
    }

    pub(super) fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.raw(name, &[len])?.0.to_f32()
    }

    pub(super) fn opt_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if self.files.contains(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }

    pub(super) fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let (t, dt) = self.raw(name, &[rows, cols])?;
        Ok(Matrix::from_bytes(dt, rows, cols, t.bytes)?)
    }

    /// `prefix.weight` [out, in] and optional `prefix.bias`.
    pub(super) fn linear(&self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear::new(
            self.matrix(&format!("{prefix}.weight"), out, inp)?,
            self.opt_vector(&format!("{prefix}.bias"), out)?,
        ))
    }

    /// `prefix.weight` and optional `prefix.bias` of a norm over `dim`.
    pub(super) fn norm(&self, prefix: &str, dim: usize) -> Result<NormWeights> {
        Ok(NormWeights {
            weight: self.vector(&format!("{prefix}.weight"), dim)?,
            bias: self.opt_vector(&format!("{prefix}.bias"), dim)?,
        })
    }
}
