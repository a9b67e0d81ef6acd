//! The `kvslim` binary's contract: flags, JSON fields, errors.

mod common;

use common::{json, kvslim, kvslim_with_stdin, perplexity_args, shared, stories, stories_text};
use std::process::Output;

#[test]
fn generate_json_has_text_and_generated_ids() {
    let m = stories();
    let o = kvslim(&["generate", "--model", &m, "--prompt", "Once upon a time", "--max-tokens", "12", "--json"]);
    let v = json(&o);
    let ids = v["token_ids"].as_array().unwrap();
    assert_eq!(ids.len(), 12);
    assert!(!v["text"].as_str().unwrap().is_empty());
    assert_eq!(v["prompt_tokens"], 5);
    assert!(v["kv_bytes_allocated"].as_u64().unwrap() > 0);
}

#[test]
fn perplexity_prefill_and_decode_agree_and_per_token_fields() {
    let m = stories();
    let toks = "1,403,407,261,378,432,383,286,261,376,298,315,421,395,317";
    let a = json(&kvslim(&["perplexity", "--model", &m, "--tokens", toks, "--json", "--per-token"]));
    let b = json(&kvslim(&["perplexity", "--model", &m, "--tokens", toks, "--prefill", "9", "--json"]));
    assert_eq!(a["tokens"], 15);
    assert_eq!(a["token_ids"].as_array().unwrap().len(), 15);
    let lp = a["logprobs"].as_array().unwrap();
    assert_eq!(lp.len(), 14);
    let mean = -lp.iter().map(|v| v.as_f64().unwrap()).sum::<f64>() / 14.0;
    assert!((mean - a["nll"].as_f64().unwrap()).abs() < 1e-9);
    assert!((a["nll"].as_f64().unwrap() - b["nll"].as_f64().unwrap()).abs() < 1e-5);
    assert!((a["ppl"].as_f64().unwrap() - a["nll"].as_f64().unwrap().exp()).abs() < 1e-9);
    assert!(a["kv_bytes_allocated"].as_u64().unwrap() > 0);
}

#[test]
fn perplexity_text_with_max_tokens() {
    let m = stories();
    let text = stories_text();
    let v = json(&kvslim(&perplexity_args(&m, &text, "64", &["--json"])));
    assert_eq!(v["tokens"], 64);
    let nll = v["nll"].as_f64().unwrap();
    assert!(nll > 0.5 && nll < 3.0, "{nll}");
}

#[test]
fn info_prints_config() {
    let o = kvslim(&["info", "--model", &stories()]);
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    for want in ["Llama", "layers", "kv heads", "4 (group of 2)", "parameters", "weight bytes"] {
        assert!(s.contains(want), "missing {want:?} in:\n{s}");
    }
    let v = json(&kvslim(&["info", "--model", &stories(), "--json"]));
    assert_eq!(v["config"]["n_layers"], 5);
    assert_eq!(v["config"]["vocab_size"], 512);
}

#[test]
fn bad_inputs_give_clear_errors() {
    let m = stories();
    let cases: &[(&[&str], &str)] = &[
        (&["generate", "--model", &m, "--prompt", "x", "--policy", "nonsense:x=1"], "unknown policy"),
        (&["generate", "--model", "/no/such/model.gguf", "--prompt", "x"], "/no/such/model.gguf"),
        (&["perplexity", "--model", &m, "--tokens", "1,99999"], "outside the vocabulary"),
        (&["perplexity", "--model", &m, "--tokens", "1"], "at least 2 tokens"),
        (&["generate", "--model", &m, "--prompt", "x", "--top-p", "0"], "top_p"),
    ];
    for (args, want) in cases {
        let o = kvslim(args);
        assert!(!o.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{args:?}: stderr lacks {want:?}:\n{err}");
        assert!(!err.contains("panicked"), "{args:?} panicked:\n{err}");
    }
    // a prompt longer than the context (512 for stories260K)
    let long = "Once upon a time ".repeat(200);
    let o = kvslim(&["generate", "--model", &m, "--prompt", &long]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("context"), "{err}");
}

#[test]
fn every_subcommand_has_help() {
    for sub in ["info", "generate", "compress", "chat", "perplexity", "bench", "calibrate", "eval", "tune", "serve"] {
        let o = kvslim(&[sub, "--help"]);
        assert!(o.status.success(), "{sub} --help");
        assert!(String::from_utf8_lossy(&o.stdout).contains("--model"));
    }
}

#[test]
fn perplexity_diagnostics_files_and_compare_full() {
    let m = stories();
    let dir = std::env::temp_dir().join(format!("kvslim-cli-diag-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (kept, trace) = (dir.join("kept.json"), dir.join("trace.jsonl"));
    let text = stories_text();
    let (kept_out, trace_out) = (kept.to_str().unwrap(), trace.to_str().unwrap());
    let diagnostics = ["--compare-full", "--kept-out", kept_out, "--trace-out", trace_out, "--trace-every", "5"];
    let args = perplexity_args(&m, &text, "200", &["--policy", "h2o:heavy=16,recent=16", "--json"]);
    let v = json(&kvslim(&[&args[..], &diagnostics].concat()));
    assert_eq!(v["budget_slots"], 32);
    let c = &v["compare_full"];
    assert!(c["kl_mean"].as_f64().unwrap() > 0.0);
    let agree = c["top1_agreement"].as_f64().unwrap();
    assert!(agree > 0.3 && agree < 1.0, "{agree}");
    let mass = c["retained_mass"]["mean"].as_f64().unwrap();
    assert!(mass > 0.0 && mass < 1.0);
    assert_eq!(c["retained_mass_per_layer"].as_array().unwrap().len(), 5);

    let k: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&kept).unwrap()).unwrap();
    let layers = k["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 5);
    for l in layers {
        let heads = l["kv_heads"].as_array().unwrap();
        assert_eq!(heads.len(), 4);
        for h in heads {
            let p: Vec<u64> = h.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            assert_eq!(p.len(), 32);
            assert!(p.windows(2).all(|w| w[0] < w[1]), "sorted ascending");
            assert_eq!(*p.last().unwrap(), 198, "the last fed token (position 198) is kept");
        }
    }
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&trace).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let events: Vec<_> = lines.iter().filter(|l| l.get("victim_pos").is_some()).collect();
    assert!(!events.is_empty());
    for e in &events {
        assert_eq!(e["step"].as_u64().unwrap() % 5, 0, "sampled every 5 steps");
        assert_eq!(e["victim_age"].as_u64().unwrap(), e["step"].as_u64().unwrap() - e["victim_pos"].as_u64().unwrap());
        assert!(e["margin"].as_f64().unwrap() >= 0.0);
    }
    assert_eq!(lines.iter().filter(|l| l["summary"] == "layer").count(), 5);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn generate_under_h2o_reports_bounded_kv() {
    let m = stories();
    let v = json(&kvslim(&[
        "generate",
        "--model",
        &m,
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "100",
        "--policy",
        "h2o:heavy=8,recent=8",
        "--json",
    ]));
    assert_eq!(v["token_ids"].as_array().unwrap().len(), 100);
    // 5 layers × 4 KV heads × 17 slots × 8 dims × 4 bytes × (K + V)
    assert_eq!(v["kv_bytes_allocated"], 5 * 4 * 17 * 8 * 4 * 2);
}

#[test]
fn calibrate_then_chai_perplexity_reports_clusters_and_shrunk_k() {
    let m = stories();
    let dir = std::env::temp_dir().join(format!("kvslim-cli-chai-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan = dir.join("plan.json");
    let text = stories_text();
    let o = kvslim(&[
        "calibrate",
        "--model",
        &m,
        "--text",
        &text,
        "--samples",
        "16",
        "--seq-len",
        "32",
        "--out",
        plan.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let layers = p["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 5);
    for l in layers {
        let k = l["k"].as_u64().unwrap();
        assert!((1..=8).contains(&k));
        assert_eq!(l["errors"].as_array().unwrap().len(), 8);
    }
    let spec = format!("chai:plan={}", plan.display());
    let chai = json(&kvslim(&perplexity_args(&m, &text, "64", &["--policy", &spec, "--json"])));
    let full = json(&kvslim(&perplexity_args(&m, &text, "64", &["--json"])));
    let clusters = chai["chai_clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 5);
    for (l, layer) in clusters.iter().enumerate() {
        let cl = layer["clusters"].as_array().unwrap();
        assert_eq!(cl.len() as u64, layers[l]["k"].as_u64().unwrap());
        let mut heads: Vec<u64> =
            cl.iter().flat_map(|c| c.as_array().unwrap().iter().map(|h| h.as_u64().unwrap())).collect();
        heads.sort();
        assert_eq!(heads, (0..8).collect::<Vec<_>>(), "a partition of the 8 heads");
        assert_eq!(layer["representatives"].as_array().unwrap().len(), cl.len());
    }
    assert!(chai["kv_bytes_allocated"].as_u64().unwrap() <= full["kv_bytes_allocated"].as_u64().unwrap());
    std::fs::remove_dir_all(&dir).ok();
}

/// `calibrate --kvzap --also-text`: windows from both texts make one
/// predictor whose header names both; a second text too short for its
/// share of the windows is an error naming it.
#[test]
fn calibrate_kvzap_mixes_texts_and_names_a_short_one() {
    let m = stories();
    let dir = std::env::temp_dir().join(format!("kvslim-cli-kvzap-mix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = stories_text();
    let other = dir.join("other.txt");
    let story = std::fs::read_to_string(&text).unwrap();
    std::fs::write(&other, &story[story.len() / 2..]).unwrap();
    let out = dir.join("mixed.kvzap");
    let args = |also: &str, out: &str| -> Vec<String> {
        ["calibrate", "--kvzap", "--model", &m, "--text", &text, "--also-text", also]
            .iter()
            .map(|s| s.to_string())
            .chain(
                ["--samples", "3", "--held-out", "1", "--seq-len", "64", "--threads", "1", "-o", out].map(String::from),
            )
            .collect()
    };
    let run = |a: Vec<String>| kvslim(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let o = run(args(other.to_str().unwrap(), out.to_str().unwrap()));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&out).unwrap();
    let header = String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]).into_owned();
    assert!(header.contains(&format!("{text} + {}", other.display())), "{header}");
    let short = dir.join("short.txt");
    std::fs::write(&short, "Once upon a time there was a cat.").unwrap();
    let o = run(args(short.to_str().unwrap(), dir.join("x.kvzap").to_str().unwrap()));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("short.txt"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `calibrate --kvzap --dump-pairs`: a manifest naming every window, the
/// held-out ones marked, each file exactly its hidden states and scores.
#[test]
fn calibrate_kvzap_dumps_its_training_pairs() {
    let m = stories();
    let dir = std::env::temp_dir().join(format!("kvslim-cli-kvzap-dump-{}", std::process::id()));
    let pairs = dir.join("pairs");
    let out = dir.join("p.kvzap");
    let text = stories_text();
    let o = kvslim(&[
        "calibrate",
        "--kvzap",
        "--model",
        &m,
        "--text",
        &text,
        "--samples",
        "3",
        "--held-out",
        "1",
        "--seq-len",
        "64",
        "--threads",
        "1",
        "--dump-pairs",
        pairs.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(pairs.join("manifest.json")).unwrap()).unwrap();
    let (layers, heads, hidden) = (
        manifest["layers"].as_u64().unwrap(),
        manifest["kv_heads"].as_u64().unwrap(),
        manifest["hidden"].as_u64().unwrap(),
    );
    let windows = manifest["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 4);
    assert_eq!(windows.iter().filter(|w| w["held_out"] == true).count(), 1);
    for w in windows {
        let n = w["tokens"].as_u64().unwrap();
        let len = std::fs::metadata(pairs.join(w["file"].as_str().unwrap())).unwrap().len();
        assert_eq!(len, 4 * (layers * n * hidden + layers * heads * n), "{w}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `kvslim chat` with piped stdin: one reply per user line, `/reset` and
/// `/quit` honoured, the template's source reported; SmolLM2's template
/// puts its turn markers in the prompt (`--show-prompt`).
#[test]
fn chat_reads_turns_from_stdin() {
    let run = |model: &str, input: &str| -> Output {
        kvslim_with_stdin(
            &["chat", "--model", model, "--max-tokens", "6", "--system", "Be brief.", "--show-prompt"],
            input,
        )
    };
    let o = run(&stories(), "Once upon a time\n\n/reset\nLily and Ben\n/quit\nnot read\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("no chat template"), "{err}");
    assert_eq!(err.matches("generated tokens").count(), 2, "two turns: {err}");
    assert!(err.contains("conversation reset"), "{err}");
    // after /reset the second prompt holds only the system prompt and the new turn
    assert!(err.contains("system: Be brief.\nuser: Lily and Ben\nassistant:"), "{err}");
    assert!(!err.contains("not read"), "{err}");

    let smol = shared().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let o = run(&smol.display().to_string(), "Hi\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("GGUF `tokenizer.chat_template`"), "{err}");
    assert!(
        err.contains(
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        ),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&o.stdout).trim().is_empty());
}

#[test]
fn eval_shard_flag_errors_are_clear() {
    for (shard, want) in [("3/2", "out of range"), ("x", "expected I/N"), ("1/0", "at least 1")] {
        let o =
            kvslim(&["eval", "--model", &stories(), "--tasks", "passkey", "--shard", shard, "--out", "/nonexistent"]);
        assert!(!o.status.success(), "{shard}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("--shard") && err.contains(want), "{shard}: {err}");
    }
    let o = kvslim(&["eval", "merge", "--out", "/nonexistent/m", "/nonexistent/a"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("shard.json"));
}

/// `lcc:FILE` end to end: every item's first generated line is scored by
/// exact match (0 or 1) and edit similarity (in [0, 1]), per item and on
/// average, for each policy; `max_context` leaves long items out and
/// `limit` counts what remains.
#[test]
fn eval_lcc_scores_the_first_line() {
    let dir = std::env::temp_dir().join(format!("kvslim-lcc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let items = dir.join("items.jsonl");
    let long = "Once upon a time there was a little girl. ".repeat(20);
    let lines = [
        serde_json::json!({"context": "Once upon a time, there was a little girl named Lily.\n", "answer": "She liked to play."}),
        serde_json::json!({"context": long, "answer": "x"}),
        serde_json::json!({"context": "Tom had a red ball.\n", "answer": "Tom had a red ball."}),
        serde_json::json!({"context": "The cat sat on the mat.\n", "answer": "The dog ran."}),
    ];
    std::fs::write(&items, lines.iter().map(|l| l.to_string() + "\n").collect::<String>()).unwrap();
    let out = dir.join("out");
    let spec = format!("lcc:{},max_context=64,limit=2", items.display());
    let o = kvslim(&[
        "eval",
        "--model",
        &stories(),
        "--tokenizer",
        &shared().join("models/stories260K/tok512.bin").display().to_string(),
        "--tasks",
        &spec,
        "--policies",
        "full;h2o",
        "--budgets",
        "50%",
        "--out",
        &out.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2, "full and h2o 50%");
    for r in &rows {
        assert_eq!(r["items"], 2, "the long item is left out, the limit counts the rest: {r}");
        let exact: Vec<f64> = r["per_item"]["exact"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let sim: Vec<f64> = r["per_item"]["edit_sim"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!((exact.len(), sim.len()), (2, 2));
        assert!(exact.iter().all(|&e| e == 0.0 || e == 1.0));
        assert!(sim.iter().all(|&s| (0.0..=1.0).contains(&s)));
        assert!(exact.iter().zip(&sim).all(|(&e, &s)| e == 0.0 || s == 1.0), "an exact match has similarity 1");
        let mean = sim.iter().sum::<f64>() / 2.0;
        assert!((r["metrics"]["edit_sim"].as_f64().unwrap() - mean).abs() < 1e-12);
    }
    let bad = kvslim(&["eval", "--model", &stories(), "--tasks", &format!("lcc:{},depth=3", items.display())]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("max_context"), "{}", String::from_utf8_lossy(&bad.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--draft-model` (here the model drafting for itself through the flag)
/// gives plain greedy's tokens in `generate` and `chat`, reports its
/// drafts, and refuses a model of another vocabulary by name.
#[test]
fn draft_model_gives_greedy_tokens_and_refuses_another_vocabulary() {
    let smol = shared().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf").display().to_string();
    let gen = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", &smol, "--prompt", "The capital of France is", "--max-tokens", "16"];
        args.extend_from_slice(&["--temperature", "0", "--json"]);
        args.extend_from_slice(extra);
        json(&kvslim(&args))
    };
    let plain = gen(&[]);
    for extra in
        [&["--draft-model", &smol][..], &["--draft-model", &smol, "--speculative", "model", "--draft-len", "3"]]
    {
        let spec = gen(extra);
        assert_eq!(spec["token_ids"], plain["token_ids"], "{extra:?}");
        assert_eq!(spec["speculative"]["draft_model"], smol.as_str());
        assert!(spec["speculative"]["accepted"].as_u64().unwrap() > 0, "{extra:?}: {}", spec["speculative"]);
    }
    let chat = |extra: &[&str]| {
        let mut args = vec!["chat", "--model", &smol, "--max-tokens", "12", "--temperature", "0"];
        args.extend_from_slice(extra);
        let o = kvslim_with_stdin(&args, "Name a colour.\n");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    assert_eq!(chat(&["--draft-model", &smol]), chat(&[]));

    let o = kvslim(&["generate", "--model", &smol, "--prompt", "Hi", "--draft-model", &stories()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("does not share the target's vocabulary"), "{err}");
    let o = kvslim(&["generate", "--model", &smol, "--prompt", "Hi", "--speculative", "model"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--draft-model"), "{err}");
}
