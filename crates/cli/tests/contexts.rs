//! `kvslim compress` and `--context` on `generate` and `chat`: a document
//! compressed once answers from its file as it does on a fresh compress
//! (the same answer twice from one file), keeps the bytes its budget
//! says, and a bad file is a clear error naming it, never a panic.

mod common;

use common::{json, kvslim, kvslim_with_stdin, shared, stories};

fn smollm() -> String {
    shared().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf").display().to_string()
}

fn document() -> String {
    let raw = std::fs::read_to_string(shared().join("data/wikitext2/wiki.test.raw")).unwrap();
    raw[..3000].replace("\r\n", "\n")
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvslim-contexts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn compress_then_ask_from_the_file() {
    let m = smollm();
    let doc = document();
    let ctx = scratch("doc.ctx");
    let ctx_s = ctx.display().to_string();
    let policy = "h2o:heavy=6.25%,recent=6.25%,kv_dtype=q8";
    let made = json(&kvslim(&["compress", "-m", &m, "--chat", "-p", &doc, "--policy", policy, "-o", &ctx_s, "--json"]));
    let (kv, full, file) = (
        made["kv_bytes"].as_u64().unwrap(),
        made["kv_bytes_full"].as_u64().unwrap(),
        made["file_bytes"].as_u64().unwrap(),
    );
    assert!(made["tokens"].as_u64().unwrap() > 500, "{made}");
    assert!(kv * 100 <= full * 13, "12.5% kept: {kv} of {full}");
    assert!(
        file < full * 15 / 100 + 64 * 1024,
        "the file ({file} bytes) holds the kept rows, not the full cache's {full}"
    );

    let ask = || {
        json(&kvslim(&[
            "generate",
            "-m",
            &m,
            "--context",
            &ctx_s,
            "-p",
            "Who is Robert Boulter?",
            "--max-tokens",
            "8",
            "--json",
        ]))
    };
    let (a, b) = (ask(), ask());
    assert_eq!(a["token_ids"], b["token_ids"], "one file, one answer");
    assert_eq!(a["context_tokens"], made["tokens"]);
    assert_eq!(a["policy"], policy);
    assert!(a["question_token_ids"].as_array().unwrap().len() < 40, "only the question is fed: {a}");

    let o = kvslim_with_stdin(&["chat", "-m", &m, "--context", &ctx_s, "--max-tokens", "6"], "Who is he?\nAnd then?\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.matches("generated tokens").count(), 2, "{err}");
    assert!(err.contains("loaded in"), "{err}");

    // --policy belongs to compress
    let o = kvslim(&["generate", "-m", &m, "--context", &ctx_s, "-p", "x", "--policy", "h2o:heavy=4,recent=4"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("does not apply with --context"));
}

#[test]
fn bad_context_files_are_refused_by_name() {
    let m = smollm();
    let ctx = scratch("small.ctx");
    let ctx_s = ctx.display().to_string();
    json(&kvslim(&["compress", "-m", &m, "-p", "Once upon a time there was a cat.", "-o", &ctx_s, "--json"]));
    let bytes = std::fs::read(&ctx).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated.ctx", bytes[..bytes.len() / 2].to_vec(), "truncated"),
        (
            "flipped.ctx",
            {
                let mut b = bytes.clone();
                let i = b.len() - 100;
                b[i] ^= 1;
                b
            },
            "checksum",
        ),
        ("text.ctx", b"hello".to_vec(), "not a kvslim context"),
    ];
    for (name, content, want) in cases {
        let p = scratch(name);
        std::fs::write(&p, content).unwrap();
        let o = kvslim(&["generate", "-m", &m, "--context", &p.display().to_string(), "-p", "x"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{name} accepted");
        assert!(err.contains(want) && err.contains(name), "{name}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // another model
    let o = kvslim(&["generate", "-m", &stories(), "--context", &ctx_s, "-p", "x"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("made with model"), "{err}");
}
