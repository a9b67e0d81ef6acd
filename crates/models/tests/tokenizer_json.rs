//! The Hugging Face `tokenizer.json` path: the SmolLM2 GGUF vocabulary is
//! written out as a `tokenizer.json` (the `tokenizers` crate's own format)
//! and read back through the loader; both must encode the reference ids.

mod common;

use common::shared;
use kvslim_models::loader::safetensors::SafetensorsFiles;
use kvslim_models::tokenizer::TokenizerKind;
use kvslim_models::{load_model, loader::load_tokenizer};

#[test]
fn tokenizer_json_round_trip_matches_reference_ids() {
    let gguf = shared().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let m = load_model(&gguf).unwrap();
    let tok = m.tokenizer.unwrap();
    let TokenizerKind::Hf(inner) = &tok.kind else { panic!("SmolLM2 has a byte-level BPE vocabulary") };
    let dir = std::env::temp_dir().join(format!("kvslim-tokjson-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, inner.to_string(false).unwrap()).unwrap();

    let loaded = load_tokenizer(&path, tok.bos, tok.eos.clone()).unwrap();
    let refs = SafetensorsFiles::open(&shared().join("fixtures/smollm2/reference.safetensors")).unwrap();
    let want: Vec<u32> = refs.get("prompt_ids").unwrap().to_i64().iter().map(|&v| v as u32).collect();
    let prompt = "The capital of France is Paris. The capital of Germany is";
    assert_eq!(loaded.encode(prompt).unwrap(), want);
    let text = std::fs::read_to_string(shared().join("fixtures/smollm2/text.txt")).unwrap();
    let ids = loaded.encode(&text).unwrap();
    assert_eq!(ids, tok.encode(&text).unwrap());
    assert_eq!(loaded.decode(&ids).unwrap(), text, "decode(encode(text)) == text");
    assert!(!loaded.add_bos, "tokenizer.json pipelines add BOS themselves");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn broken_tokenizer_json_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("kvslim-tokjson-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, "{\"model\": 3").unwrap();
    let e = load_tokenizer(&path, None, vec![]).err().expect("not a tokenizer").to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Streaming ids one at a time prints exactly the text of decoding them all
/// at once (spaces, multi-byte characters split over byte tokens included),
/// with both tokenizer families.
#[test]
fn streamed_pieces_add_up_to_the_whole_decode() {
    use kvslim_models::tokenizer::StreamDecoder;
    let text = "Once upon a time, Zoë saw 3 ducks — “quack” — and said: ¿dónde está el 日本語 café? 🙂 The end.";
    for model in ["models/stories260K/stories260K.bin", "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"]
    {
        let m = kvslim_models::load_model(&shared().join(model)).unwrap();
        let tok = m.tokenizer.as_ref().unwrap();
        let ids = tok.encode(text).unwrap();
        let mut stream = StreamDecoder::new();
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&stream.push(tok, id).unwrap());
        }
        assert_eq!(out, tok.decode(&ids).unwrap(), "{model}");
    }
}
