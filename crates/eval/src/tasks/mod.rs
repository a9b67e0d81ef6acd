//! Task kinds and the task-spec grammar. A kind is one module
//! implementing [`Task`] and [`Prepared`], listed once in [`KINDS`].
//!
//! ```text
//! ppl:FILE[,seq_len=N][,prompt=P]   text → BOS + N−1 token windows (default N = 512);
//!                                   P: each window's first P tokens a compressed prompt,
//!                                   its continuation alone scored
//! mc:FILE[,delim=TEXT]              {"query","choices","gold"} jsonl
//! hellaswag:FILE                    llama.cpp's 6-line HellaSwag, plain or .bz2
//! gen:FILE[,max_tokens=N]           prompts, one per line or jsonl {"prompt"} (default N = 128)
//! lcc:FILE[,max_tokens=N][,max_context=T]
//!                                   code completion: jsonl {"context","answer"}, the first
//!                                   generated line scored (see [`code`]; default N = 64);
//!                                   items with more than T context tokens are left out
//! RULER[:lengths=A,B,..][,depths=X,Y,..][,per_cell=N][,seed=S][,max_tokens=N]
//!      [,haystack=noise|text|text:FILE]
//!                                   RULER: passkey, niah_single, niah_multikey,
//!                                   niah_multivalue, niah_multiquery, vt, cwe
//!                                   (see [`ruler`]); haystack: the needles' filler,
//!                                   RULER's repeated noise (default) or real text,
//!                                   WikiText-2's test split from the shared folder
//!                                   or FILE (the first 45%, held out from
//!                                   calibration; not for cwe)
//! FILE                              kind from the extension: .jsonl → mc,
//!                                   .bz2 → hellaswag, .raw/.txt/.tokens → ppl
//! ```
//!
//! Every kind also takes `limit=N`: only the first N items (windows for
//! `ppl`). Options follow the file after commas (so a path cannot contain a
//! comma); a list value continues over the following comma-separated
//! numbers (`lengths=256,512,depths=0,0.5,1`). In `delim=`, `\n`, `\t` and
//! `\\` are escapes and `\s` is a space (`delim=\nAnswer:\s`).

pub mod code;
pub mod gen;
pub mod kind;
pub mod mc;
pub mod ppl;
pub mod ruler;
mod spec;
pub mod text;
#[cfg(test)]
mod tiny_test;

// the shared folder, found as every crate's tests find it
#[cfg(test)]
#[path = "../../../../testing/shared_dir.rs"]
mod shared_dir;

pub use code::{load_code_items, CodeItem};
pub use kind::{GenerationItems, Kind, KvPeak, Prepared, Task};
pub use mc::{load_hellaswag, load_mc_jsonl, McItem};
pub use ruler::{
    answers_found, ruler_items, ruler_items_in, try_ruler_items, Haystack, HaystackText, RulerConfig, RulerItem,
    RulerTask,
};
pub use spec::TaskSpec;
pub use text::{load_gen_prompts, load_ppl_text, token_windows, GenPrompt, PplText};

use crate::error::{EvalError, Result};
use std::io::Read;
use std::path::Path;

/// Every task kind, one line each; specs and `results.md` follow this order.
pub const KINDS: &[&Kind] = &[
    &ppl::KIND,
    &mc::MC,
    &mc::HELLASWAG,
    &gen::KIND,
    &code::KIND,
    &ruler::KIND,
    #[cfg(test)]
    &tiny_test::KIND,
];

/// Metrics that `results.md` tabulates (and `plots/` charts), in this
/// order, when a row has them: every kind's [`Kind::headline`].
pub fn headline_metrics() -> Vec<&'static str> {
    let mut out: Vec<&str> = Vec::new();
    for m in KINDS.iter().flat_map(|k| k.headline.iter()) {
        if !out.contains(m) {
            out.push(m);
        }
    }
    out
}

/// Reads a UTF-8 text file, decompressing it when it is bzip2 (by the
/// `BZh` magic, whatever the name).
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| EvalError::io(path, e))?;
    let bytes = if bytes.starts_with(b"BZh") {
        let mut out = Vec::with_capacity(bytes.len() * 5);
        bzip2_rs::DecoderReader::new(&bytes[..])
            .read_to_end(&mut out)
            .map_err(|e| EvalError::File { path: path.into(), reason: format!("bzip2: {e}") })?;
        out
    } else {
        bytes
    };
    String::from_utf8(bytes).map_err(|e| EvalError::File {
        path: path.into(),
        reason: format!("not UTF-8 text (byte {} of the decoded data)", e.utf8_error().valid_up_to()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ppl(path: &str, seq_len: usize, limit: Option<usize>) -> TaskSpec {
        TaskSpec { kind: Box::new(ppl::Ppl { path: path.into(), seq_len, prompt: 0 }), limit }
    }

    fn ruler_config(t: &TaskSpec) -> &RulerConfig {
        &t.kind.downcast::<ruler::Ruler>().expect("a RULER task").config
    }

    #[test]
    fn run_wide_defaults_fill_only_what_the_spec_leaves_out() {
        let t = TaskSpec::parse_with_defaults("ppl:t.txt", Some(3), Some(64)).unwrap();
        assert_eq!(t, ppl("t.txt", 64, Some(3)));
        let t = TaskSpec::parse_with_defaults("ppl:t.txt,seq_len=32,limit=1", Some(3), Some(64)).unwrap();
        assert_eq!(t, ppl("t.txt", 32, Some(1)));
        assert_eq!(
            TaskSpec::parse_with_defaults("mc:q.jsonl", None, Some(64)).unwrap(),
            TaskSpec::parse("mc:q.jsonl").unwrap()
        );
        assert!(TaskSpec::parse_with_defaults("ppl:t.txt", None, Some(1)).is_err());
    }

    #[test]
    fn parses_every_kind_and_round_trips() {
        for s in [
            "ppl:../shared/data/wikitext2/wiki.test.raw",
            "ppl:data/t.txt,seq_len=128,limit=4",
            "ppl:data/t.txt,seq_len=128,prompt=96",
            "mc:../shared/data/piqa/piqa_llmfoundry.jsonl",
            "mc:a.jsonl,delim=\\nAnswer:\\s",
            "hellaswag:../shared/data/hellaswag/hellaswag_val_full.txt.bz2,limit=100",
            "gen:prompts.txt,max_tokens=64",
            "passkey",
            "passkey:lengths=128,256,depths=0,0.5,1,per_cell=3,seed=9,max_tokens=12",
            "niah_multikey:lengths=1024,2048",
            "vt:depths=0.5,max_tokens=20",
            "cwe",
        ] {
            let t = TaskSpec::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(TaskSpec::parse(&t.to_string()).unwrap(), t, "{s} → {t}");
        }
        let t = TaskSpec::parse("passkey:lengths=128,256,depths=0,0.5,1").unwrap();
        let config = ruler_config(&t);
        assert_eq!(config.task, RulerTask::Passkey);
        assert_eq!(config.lengths, [128, 256]);
        assert_eq!(config.depths, [0.0, 0.5, 1.0]);
        let t = TaskSpec::parse("mc:a.jsonl,delim=\\nAnswer:\\s").unwrap();
        let mc = mc::Mc { path: "a.jsonl".into(), delimiter: Some("\nAnswer: ".into()) };
        assert_eq!(t, TaskSpec { kind: Box::new(mc), limit: None });
        assert_eq!(TaskSpec::parse("ppl:/x/y/wiki.test.raw,limit=3").unwrap().label(), "ppl:wiki.test.raw,limit=3");
        let t = TaskSpec::parse("ppl:t.txt,prompt=96").unwrap();
        assert_eq!(t.kind.downcast::<ppl::Ppl>().map(|p| p.prompt), Some(96));
    }

    #[test]
    fn haystack_option_labels_text_cells_and_leaves_noise_labels_alone() {
        let label = |s: &str| TaskSpec::parse(s).unwrap().label();
        // noise is the default: its specs and labels are what they always were
        assert_eq!(TaskSpec::parse("niah_single:haystack=noise").unwrap(), TaskSpec::parse("niah_single").unwrap());
        assert_eq!(label("niah_single:haystack=noise"), "niah_single");
        assert_eq!(label("vt:lengths=1024,haystack=noise,per_cell=3"), "vt:lengths=1024,per_cell=3");
        assert_eq!(label("cwe:haystack=noise"), "cwe");
        // text cells say so
        assert_eq!(label("niah_single:haystack=text"), "niah_single:haystack=text");
        assert_eq!(
            label("passkey:lengths=1024,2048,haystack=text:/data/essays.txt,limit=2"),
            "passkey:haystack=text:essays.txt,lengths=1024,2048,limit=2"
        );
        for s in [
            "niah_multiquery:haystack=text,lengths=512",
            "vt:haystack=text:/data/essays.txt,depths=0.5",
            "niah_multikey:haystack=text",
        ] {
            let t = TaskSpec::parse(s).unwrap();
            assert_eq!(TaskSpec::parse(&t.to_string()).unwrap(), t, "{s} → {t}");
            assert!(t.to_string().contains("haystack=text"), "{t}");
        }
        let t = TaskSpec::parse("niah_multivalue:haystack=text:/data/essays.txt").unwrap();
        assert_eq!(ruler_config(&t).haystack, Haystack::Text(Some("/data/essays.txt".into())));
        // a missing haystack file stops a run before it starts
        let e = TaskSpec::parse("niah_single:haystack=text:/no/such/essays.txt").unwrap().check_readable().unwrap_err();
        assert!(e.to_string().contains("/no/such/essays.txt"), "{e}");
        TaskSpec::parse("niah_single:haystack=text").unwrap().check_readable().unwrap();
        TaskSpec::parse("niah_single").unwrap().check_readable().unwrap();
    }

    #[test]
    fn kind_from_extension() {
        for (spec, kind) in [
            ("../shared/data/copa/copa.jsonl", "mc"),
            ("../shared/data/hellaswag/hellaswag_val_full.txt.bz2", "hellaswag"),
            ("../shared/data/wikitext2/wiki.test.raw", "ppl"),
            ("story.txt,limit=2", "ppl"),
        ] {
            assert_eq!(TaskSpec::parse(spec).unwrap().kind_name(), kind, "{spec}");
        }
    }

    #[test]
    fn bad_specs_name_the_problem() {
        let cases = [
            ("", "empty task"),
            ("ppl", "needs a file"),
            ("ppl:", "needs a file"),
            ("data.csv", "cannot tell the task kind"),
            ("ppl:a.txt,seq_len=x", "`seq_len=x` is not a valid number"),
            ("ppl:a.txt,seq_len=1", "seq_len must be ≥ 2"),
            ("ppl:a.txt,delim=x", "unknown option `delim` for `ppl` (allowed: seq_len, prompt, limit)"),
            ("ppl:a.txt,prompt=1", "prompt must be ≥ 2 tokens"),
            ("mc:a.jsonl,limit=0", "limit must be ≥ 1"),
            ("mc:a.jsonl,limit=1,limit=2", "given twice"),
            ("passkey:depths=0,1.5", "depth 1.5 is outside [0, 1]"),
            ("passkey:lengths=0", "lengths must be ≥ 1"),
            ("passkey:foo", "`foo` is not key=value"),
            ("vt:delim=x", "unknown option `delim` for `vt`"),
            ("gen:p.txt,max_tokens=1,2", "takes one value"),
            ("niah_single:haystack=bogus", "`haystack=bogus` is not a haystack (noise, text or text:FILE)"),
            ("vt:haystack=text:", "needs a file"),
            ("cwe:haystack=text", "`cwe` has no haystack"),
            ("ppl:a.txt,haystack=text", "unknown option `haystack` for `ppl`"),
        ];
        for (spec, want) in cases {
            let e = TaskSpec::parse(spec).unwrap_err().to_string();
            assert!(e.contains(want), "{spec:?}: {e}");
            assert!(e.starts_with(&format!("task spec `{spec}`")), "{e}");
        }
    }

    #[test]
    fn bz2_is_detected_by_magic() {
        // "hello\n" compressed with bzip2 -9
        let bz: [u8; 42] = [
            0x42, 0x5a, 0x68, 0x39, 0x31, 0x41, 0x59, 0x26, 0x53, 0x59, 0xc1, 0xc0, 0x80, 0xe2, 0x00, 0x00, 0x01, 0x41,
            0x00, 0x00, 0x10, 0x02, 0x44, 0xa0, 0x00, 0x30, 0xcd, 0x00, 0xc3, 0x46, 0x29, 0x97, 0x17, 0x72, 0x45, 0x38,
            0x50, 0x90, 0xc1, 0xc0, 0x80, 0xe2,
        ];
        let dir = std::env::temp_dir().join(format!("kvslim-eval-bz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("h.txt.bz2");
        std::fs::write(&p, &bz[..]).unwrap();
        assert_eq!(read_text(&p).unwrap(), "hello\n");
        std::fs::write(&p, &bz[..20]).unwrap();
        let e = read_text(&p).unwrap_err().to_string();
        assert!(e.contains("h.txt.bz2") && e.contains("bzip2"), "{e}");
        std::fs::write(&p, [0xffu8, 0xfe]).unwrap();
        assert!(read_text(&p).unwrap_err().to_string().contains("not UTF-8"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
