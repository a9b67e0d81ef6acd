//! Task loaders and the task-spec grammar.
//!
//! ```text
//! ppl:FILE[,seq_len=N]              text → BOS + N−1 token windows (default N = 512)
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
pub mod mc;
pub mod ruler;
pub mod text;

pub use code::{load_code_items, CodeItem};
pub use mc::{load_hellaswag, load_mc_jsonl, McItem};
pub use ruler::{
    answers_found, ruler_items, ruler_items_in, try_ruler_items, Haystack, HaystackText, RulerConfig, RulerItem,
    RulerTask,
};
pub use text::{load_gen_prompts, load_ppl_text, token_windows, GenPrompt, PplText};

use crate::{EvalError, Result};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

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

/// What a task is and where its data lives.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskKind {
    Ppl { path: PathBuf, seq_len: usize },
    Mc { path: PathBuf, delimiter: Option<String> },
    HellaSwag { path: PathBuf },
    Gen { path: PathBuf, max_tokens: usize },
    Lcc { path: PathBuf, max_tokens: usize, max_context: Option<usize> },
    Ruler { config: RulerConfig, max_tokens: usize },
}

/// A parsed task spec (see the module docs for the grammar).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskSpec {
    pub kind: TaskKind,
    /// Only the first N items.
    pub limit: Option<usize>,
}

/// A task's loaded data.
#[derive(Clone, Debug)]
pub enum TaskData {
    /// Cut into windows with the model's tokenizer ([`PplText::windows`]).
    Ppl(PplText),
    Mc(Vec<McItem>),
    Gen(Vec<GenPrompt>),
    Lcc(Vec<CodeItem>),
    /// Items are made with the model's tokenizer ([`ruler_items`]).
    Ruler(RulerConfig),
}

pub const DEFAULT_SEQ_LEN: usize = 512;
pub const DEFAULT_GEN_TOKENS: usize = 128;
/// Most tokens a code-completion item generates (its first line ends it).
pub const DEFAULT_LCC_TOKENS: usize = 64;
const KINDS: &str =
    "ppl, mc, hellaswag, gen, lcc, passkey, niah_single, niah_multikey, niah_multivalue, niah_multiquery, vt, cwe";

/// Splits `k=v` options, folding bare values into the previous key's list.
fn options<'a>(parts: impl Iterator<Item = &'a str>) -> std::result::Result<Vec<(&'a str, Vec<&'a str>)>, String> {
    let mut out: Vec<(&str, Vec<&str>)> = Vec::new();
    for part in parts.map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            Some((k, v)) => {
                let k = k.trim();
                if out.iter().any(|(pk, _)| *pk == k) {
                    return Err(format!("option `{k}` given twice"));
                }
                out.push((k, vec![v.trim()]));
            }
            None => match out.last_mut() {
                Some((_, vals)) => vals.push(part),
                None => return Err(format!("`{part}` is not key=value")),
            },
        }
    }
    Ok(out)
}

fn single<'a>(key: &str, vals: &[&'a str]) -> std::result::Result<&'a str, String> {
    match vals {
        [v] => Ok(v),
        _ => Err(format!("`{key}` takes one value, got {}", vals.len())),
    }
}

fn number<T: std::str::FromStr>(key: &str, vals: &[&str]) -> std::result::Result<T, String> {
    let v = single(key, vals)?;
    v.parse().map_err(|_| format!("`{key}={v}` is not a valid number"))
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('s') => out.push(' '),
            Some('\\') => out.push('\\'),
            Some(o) => {
                out.push('\\');
                out.push(o);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n").replace('\t', "\\t").replace(' ', "\\s")
}

impl TaskSpec {
    /// Parses a task spec.
    pub fn parse(spec: &str) -> Result<TaskSpec> {
        Self::parse_inner(spec.trim()).map_err(|reason| EvalError::TaskSpec { spec: spec.to_string(), reason })
    }

    /// [`TaskSpec::parse`], then run-wide defaults for what the spec leaves
    /// out: `limit` items, and `seq_len` for a `ppl:` window without its
    /// own `seq_len=` (`kvslim eval --limit/--seq-len`).
    pub fn parse_with_defaults(spec: &str, limit: Option<usize>, seq_len: Option<usize>) -> Result<TaskSpec> {
        let mut t = Self::parse(spec)?;
        if t.limit.is_none() {
            t.limit = limit;
        }
        if let (Some(n), TaskKind::Ppl { seq_len, .. }) = (seq_len, &mut t.kind) {
            if !spec.contains("seq_len=") {
                if n < 2 {
                    return Err(EvalError::TaskSpec {
                        spec: spec.to_string(),
                        reason: "seq_len must be at least 2".into(),
                    });
                }
                *seq_len = n;
            }
        }
        Ok(t)
    }

    fn parse_inner(spec: &str) -> std::result::Result<TaskSpec, String> {
        if spec.is_empty() {
            return Err(format!("empty task; known kinds: {KINDS}, or a file path"));
        }
        // a RULER task has no file: `vt`, `vt:lengths=…`, `vt,limit=2`
        let ruler_name = |k: &str| RulerTask::from_name(k.trim()).map(RulerTask::name);
        let head = spec.split([':', ',']).next().unwrap_or_default();
        let (kind, rest) = match spec.split_once(':') {
            Some((k, r)) if ["ppl", "mc", "hellaswag", "gen", "lcc"].contains(&k.trim()) => (k.trim(), r),
            _ if ruler_name(head).is_some() => {
                (ruler_name(head).unwrap_or_default(), spec[head.len()..].trim_start_matches([':', ',']))
            }
            _ => ("", spec),
        };
        let is_ruler = RulerTask::from_name(kind).is_some();
        let mut parts = rest.split(',');
        let path = if is_ruler { None } else { parts.next().map(str::trim).filter(|p| !p.is_empty()) };
        if !is_ruler && path.is_none() {
            return Err(format!("`{}` needs a file: {kind}:FILE", if kind.is_empty() { "task" } else { kind }));
        }
        let kind = if kind.is_empty() {
            let p = path.unwrap_or_default();
            if let Some(bad) = ["ppl", "mc", "hellaswag", "gen", "lcc"].iter().find(|k| p == **k) {
                return Err(format!("`{bad}` needs a file: {bad}:FILE"));
            }
            if p.ends_with(".jsonl") {
                "mc"
            } else if p.ends_with(".bz2") {
                "hellaswag"
            } else if [".raw", ".txt", ".tokens"].iter().any(|e| p.ends_with(e)) {
                "ppl"
            } else {
                return Err(format!(
                    "cannot tell the task kind of `{p}`; write KIND:FILE with KIND one of {KINDS} \
                     (by extension: .jsonl → mc, .bz2 → hellaswag, .raw/.txt/.tokens → ppl)"
                ));
            }
        } else {
            kind
        };
        let mut limit = None;
        let path = PathBuf::from(path.unwrap_or_default());
        let mut seq_len = DEFAULT_SEQ_LEN;
        let mut delimiter = None;
        let mut max_context = None;
        let ruler = RulerTask::from_name(kind);
        let mut max_tokens = match ruler {
            Some(r) => r.default_max_tokens(),
            None if kind == "lcc" => DEFAULT_LCC_TOKENS,
            None => DEFAULT_GEN_TOKENS,
        };
        let mut pk = RulerConfig::new(ruler.unwrap_or(RulerTask::Passkey));
        for (k, vals) in options(parts)? {
            match (kind, k) {
                (_, "limit") => {
                    let n: usize = number(k, &vals)?;
                    if n == 0 {
                        return Err("limit must be ≥ 1".into());
                    }
                    limit = Some(n);
                }
                ("ppl", "seq_len") => {
                    seq_len = number(k, &vals)?;
                    if seq_len < 2 {
                        return Err("seq_len must be ≥ 2".into());
                    }
                }
                ("mc", "delim") => delimiter = Some(unescape(single(k, &vals)?)),
                ("lcc", "max_context") => {
                    let n: usize = number(k, &vals)?;
                    if n == 0 {
                        return Err("max_context must be ≥ 1".into());
                    }
                    max_context = Some(n);
                }
                (_, "max_tokens") if kind == "gen" || kind == "lcc" || ruler.is_some() => {
                    max_tokens = number(k, &vals)?;
                    if max_tokens == 0 {
                        return Err("max_tokens must be ≥ 1".into());
                    }
                }
                (_, "lengths") if ruler.is_some() => {
                    pk.lengths = vals.iter().map(|v| number("lengths", &[v])).collect::<std::result::Result<_, _>>()?;
                    if pk.lengths.contains(&0) {
                        return Err("lengths must be ≥ 1".into());
                    }
                }
                (_, "depths") if ruler.is_some() => {
                    pk.depths = vals.iter().map(|v| number("depths", &[v])).collect::<std::result::Result<_, _>>()?;
                    if let Some(d) = pk.depths.iter().find(|d: &&f64| !(0.0..=1.0).contains(*d)) {
                        return Err(format!("depth {d} is outside [0, 1]"));
                    }
                }
                (_, "per_cell") if ruler.is_some() => {
                    pk.per_cell = number(k, &vals)?;
                    if pk.per_cell == 0 {
                        return Err("per_cell must be ≥ 1".into());
                    }
                }
                (_, "seed") if ruler.is_some() => pk.seed = number(k, &vals)?,
                (_, "haystack") if ruler.is_some() => pk.haystack = Haystack::parse(single(k, &vals)?)?,
                _ => {
                    let allowed = match kind {
                        "ppl" => "seq_len, limit",
                        "mc" => "delim, limit",
                        "hellaswag" => "limit",
                        "gen" => "max_tokens, limit",
                        "lcc" => "max_tokens, max_context, limit",
                        _ => "lengths, depths, per_cell, seed, haystack, max_tokens, limit",
                    };
                    return Err(format!("unknown option `{k}` for `{kind}` (allowed: {allowed})"));
                }
            }
        }
        if pk.task == RulerTask::CommonWords && ruler.is_some() && pk.haystack != Haystack::Noise {
            return Err("`cwe` has no haystack (its context is a list of words): `haystack=text` does not apply".into());
        }
        let kind = match kind {
            "ppl" => TaskKind::Ppl { path, seq_len },
            "mc" => TaskKind::Mc { path, delimiter },
            "hellaswag" => TaskKind::HellaSwag { path },
            "gen" => TaskKind::Gen { path, max_tokens },
            "lcc" => TaskKind::Lcc { path, max_tokens, max_context },
            _ => TaskKind::Ruler { config: pk, max_tokens },
        };
        Ok(TaskSpec { kind, limit })
    }

    /// The data file, if the task has one.
    pub fn path(&self) -> Option<&Path> {
        match &self.kind {
            TaskKind::Ppl { path, .. }
            | TaskKind::Mc { path, .. }
            | TaskKind::HellaSwag { path }
            | TaskKind::Gen { path, .. }
            | TaskKind::Lcc { path, .. } => Some(path),
            TaskKind::Ruler { .. } => None,
        }
    }

    /// A short kind name: `ppl`, `mc`, `hellaswag`, `gen`, or the RULER
    /// task (`passkey`, `niah_single`, …).
    pub fn kind_name(&self) -> &'static str {
        match &self.kind {
            TaskKind::Ppl { .. } => "ppl",
            TaskKind::Mc { .. } => "mc",
            TaskKind::HellaSwag { .. } => "hellaswag",
            TaskKind::Gen { .. } => "gen",
            TaskKind::Lcc { .. } => "lcc",
            TaskKind::Ruler { config, .. } => config.task.name(),
        }
    }

    /// The canonical spec with the file name only (no directories): the
    /// task column of result files. Options at their defaults are left out.
    pub fn label(&self) -> String {
        self.render(true)
    }

    /// Fails with the file's name when the task's data file (or a RULER
    /// task's haystack text) cannot be opened, so a run stops before it
    /// writes anything rather than at the task's turn.
    pub fn check_readable(&self) -> Result<()> {
        let path = match &self.kind {
            TaskKind::Ruler { config, .. } => config.haystack.file()?,
            _ => self.path().map(Path::to_path_buf),
        };
        let Some(path) = path.as_deref() else { return Ok(()) };
        if path.is_dir() {
            return Err(EvalError::File { path: path.to_path_buf(), reason: "is a directory, not a task file".into() });
        }
        std::fs::File::open(path).map(drop).map_err(|source| EvalError::Io { path: path.to_path_buf(), source })
    }

    fn render(&self, short: bool) -> String {
        let file = |p: &Path| {
            if short {
                p.file_name().map_or_else(|| p.display().to_string(), |f| f.to_string_lossy().into_owned())
            } else {
                p.display().to_string()
            }
        };
        let mut s = match &self.kind {
            TaskKind::Ppl { path, seq_len } => {
                let mut s = format!("ppl:{}", file(path));
                if *seq_len != DEFAULT_SEQ_LEN {
                    s += &format!(",seq_len={seq_len}");
                }
                s
            }
            TaskKind::Mc { path, delimiter } => {
                let mut s = format!("mc:{}", file(path));
                if let Some(d) = delimiter {
                    s += &format!(",delim={}", escape(d));
                }
                s
            }
            TaskKind::HellaSwag { path } => format!("hellaswag:{}", file(path)),
            TaskKind::Gen { path, max_tokens } => {
                let mut s = format!("gen:{}", file(path));
                if *max_tokens != DEFAULT_GEN_TOKENS {
                    s += &format!(",max_tokens={max_tokens}");
                }
                s
            }
            TaskKind::Lcc { path, max_tokens, max_context } => {
                let mut s = format!("lcc:{}", file(path));
                if *max_tokens != DEFAULT_LCC_TOKENS {
                    s += &format!(",max_tokens={max_tokens}");
                }
                if let Some(t) = max_context {
                    s += &format!(",max_context={t}");
                }
                s
            }
            TaskKind::Ruler { config, max_tokens } => {
                let d = RulerConfig::new(config.task);
                let mut opts = Vec::new();
                // (noise, the default, leaves the label as it always was)
                if config.haystack != d.haystack {
                    opts.push(format!("haystack={}", config.haystack.render(short)));
                }
                if config.lengths != d.lengths {
                    let v: Vec<String> = config.lengths.iter().map(|l| l.to_string()).collect();
                    opts.push(format!("lengths={}", v.join(",")));
                }
                if config.depths != d.depths {
                    let v: Vec<String> = config.depths.iter().map(|l| l.to_string()).collect();
                    opts.push(format!("depths={}", v.join(",")));
                }
                if config.per_cell != d.per_cell {
                    opts.push(format!("per_cell={}", config.per_cell));
                }
                if config.seed != d.seed {
                    opts.push(format!("seed={}", config.seed));
                }
                if *max_tokens != config.task.default_max_tokens() {
                    opts.push(format!("max_tokens={max_tokens}"));
                }
                if opts.is_empty() {
                    config.task.name().to_string()
                } else {
                    format!("{}:{}", config.task.name(), opts.join(","))
                }
            }
        };
        if let Some(n) = self.limit {
            s += &format!(",limit={n}");
        }
        s
    }

    /// Reads the task's file (nothing for a RULER task) and applies `limit`
    /// where items are known without a tokenizer.
    pub fn load(&self) -> Result<TaskData> {
        let lim = |n: usize| self.limit.unwrap_or(usize::MAX).min(n);
        Ok(match &self.kind {
            TaskKind::Ppl { path, .. } => TaskData::Ppl(load_ppl_text(path)?),
            TaskKind::Mc { path, delimiter } => {
                let mut v = load_mc_jsonl(path, delimiter.as_deref())?;
                v.truncate(lim(v.len()));
                TaskData::Mc(v)
            }
            TaskKind::HellaSwag { path } => {
                let mut v = load_hellaswag(path)?;
                v.truncate(lim(v.len()));
                TaskData::Mc(v)
            }
            TaskKind::Gen { path, .. } => {
                let mut v = load_gen_prompts(path)?;
                v.truncate(lim(v.len()));
                TaskData::Gen(v)
            }
            // `limit` counts the items within `max_context`, once tokenized
            TaskKind::Lcc { path, .. } => TaskData::Lcc(load_code_items(path)?),
            TaskKind::Ruler { config, .. } => TaskData::Ruler(config.clone()),
        })
    }
}

impl fmt::Display for TaskSpec {
    /// The canonical spec, full path included; parses back to `self`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(false))
    }
}

impl std::str::FromStr for TaskSpec {
    type Err = EvalError;
    fn from_str(s: &str) -> Result<Self> {
        TaskSpec::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_wide_defaults_fill_only_what_the_spec_leaves_out() {
        let t = TaskSpec::parse_with_defaults("ppl:t.txt", Some(3), Some(64)).unwrap();
        assert_eq!((t.limit, &t.kind), (Some(3), &TaskKind::Ppl { path: "t.txt".into(), seq_len: 64 }));
        let t = TaskSpec::parse_with_defaults("ppl:t.txt,seq_len=32,limit=1", Some(3), Some(64)).unwrap();
        assert_eq!((t.limit, &t.kind), (Some(1), &TaskKind::Ppl { path: "t.txt".into(), seq_len: 32 }));
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
        match &t.kind {
            TaskKind::Ruler { config, .. } => {
                assert_eq!(config.task, RulerTask::Passkey);
                assert_eq!(config.lengths, [128, 256]);
                assert_eq!(config.depths, [0.0, 0.5, 1.0]);
            }
            k => panic!("{k:?}"),
        }
        let t = TaskSpec::parse("mc:a.jsonl,delim=\\nAnswer:\\s").unwrap();
        assert_eq!(t.kind, TaskKind::Mc { path: "a.jsonl".into(), delimiter: Some("\nAnswer: ".into()) });
        assert_eq!(TaskSpec::parse("ppl:/x/y/wiki.test.raw,limit=3").unwrap().label(), "ppl:wiki.test.raw,limit=3");
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
        match TaskSpec::parse("niah_multivalue:haystack=text:/data/essays.txt").unwrap().kind {
            TaskKind::Ruler { config, .. } => {
                assert_eq!(config.haystack, Haystack::Text(Some("/data/essays.txt".into())))
            }
            k => panic!("{k:?}"),
        }
        // a missing haystack file stops a run before it starts
        let e = TaskSpec::parse("niah_single:haystack=text:/no/such/essays.txt").unwrap().check_readable().unwrap_err();
        assert!(e.to_string().contains("/no/such/essays.txt"), "{e}");
        TaskSpec::parse("niah_single:haystack=text").unwrap().check_readable().unwrap();
        TaskSpec::parse("niah_single").unwrap().check_readable().unwrap();
    }

    #[test]
    fn kind_from_extension() {
        let k = |s: &str| TaskSpec::parse(s).unwrap().kind_name();
        assert_eq!(k("../shared/data/copa/copa.jsonl"), "mc");
        assert_eq!(k("../shared/data/hellaswag/hellaswag_val_full.txt.bz2"), "hellaswag");
        assert_eq!(k("../shared/data/wikitext2/wiki.test.raw"), "ppl");
        assert_eq!(k("story.txt,limit=2"), "ppl");
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
            ("ppl:a.txt,delim=x", "unknown option `delim` for `ppl` (allowed: seq_len, limit)"),
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
