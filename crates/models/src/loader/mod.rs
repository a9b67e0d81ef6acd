//! Checkpoint loaders. Each turns a file format into [`ModelConfig`] +
//! [`Weights`] (+ a tokenizer when the file carries one). Every malformed
//! input is an [`Error`] naming the file and the problem.

pub mod gguf;
pub mod hf;
pub mod llama2c;
pub mod safetensors;

use crate::tokenizer::Tokenizer;
use crate::transformer::Model;
use crate::{Error, Result};
use std::path::Path;

/// A model and, when the checkpoint provides one, its tokenizer.
pub struct LoadedModel {
    pub model: Model,
    pub tokenizer: Option<Tokenizer>,
}

/// Loads a model from a Hugging Face directory, a `.gguf` file or a
/// llama2.c `.bin` checkpoint.
pub fn load_model(path: &Path) -> Result<LoadedModel> {
    let mut loaded = load_any(path)?;
    set_repeat_prompt(&mut loaded);
    Ok(loaded)
}

/// Tokenizes KVzip's reconstruction instructions for the model
/// ([`crate::Model::repeat_prompt`], [`crate::Model::repeat_part_prompt`];
/// no BOS: they follow the prompt).
pub fn set_repeat_prompt(loaded: &mut LoadedModel) {
    use crate::transformer::{REPEAT_INSTRUCTION, REPEAT_PART_INSTRUCTION};
    let Some(tok) = loaded.tokenizer.as_ref() else { return };
    if let (Ok(first), Ok(part)) = (tok.encode_after(REPEAT_INSTRUCTION), tok.encode_after(REPEAT_PART_INSTRUCTION)) {
        loaded.model.repeat_prompt = first;
        loaded.model.repeat_part_prompt = part;
    }
}

fn load_any(path: &Path) -> Result<LoadedModel> {
    if path.is_dir() {
        return hf::load(path);
    }
    if !path.exists() {
        return Err(Error::io(path, std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory")));
    }
    let mut magic = [0u8; 4];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let _ = f.read(&mut magic).map_err(|e| Error::io(path, e))?;
    }
    if &magic == b"GGUF" {
        return gguf::load(path);
    }
    match path.extension().and_then(|e| e.to_str()) {
        Some("bin") => llama2c::load(path),
        Some("safetensors") => path.parent().map(hf::load).unwrap_or_else(|| {
            Err(Error::format(path, "a .safetensors file must sit in a model directory with config.json"))
        }),
        Some("gguf") => Err(Error::format(path, "not a GGUF file (bad magic)")),
        _ => Err(Error::format(
            path,
            "unrecognised model file: expected a Hugging Face directory, a .gguf file or a llama2.c .bin",
        )),
    }
}

/// Every architecture name some loader accepts, read from the loaders'
/// own tables (for the unknown-architecture error).
pub fn supported_architectures() -> String {
    let hf: Vec<&str> = hf::supported_classes().collect();
    format!(
        "{} (Hugging Face), gguf `{}`, llama2.c",
        hf.join(", "),
        gguf::supported_architectures().collect::<Vec<_>>().join("`/`")
    )
}

/// Loads a stand-alone tokenizer: `tokenizer.json` or a llama2.c `tokenizer.bin`.
pub fn load_tokenizer(path: &Path, bos: Option<u32>, eos: Vec<u32>) -> Result<Tokenizer> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => crate::tokenizer::hf::load(path, bos, eos),
        _ => crate::tokenizer::scored::load_llama2c(path),
    }
}
