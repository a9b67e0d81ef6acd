//! What fills a needle task's context: RULER's noise or the sentences of
//! a real text (see [`super`]'s docs).

use super::super::read_text;
use crate::error::{EvalError, Result};
use std::path::{Path, PathBuf};

/// What fills a needle task's context (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Haystack {
    /// RULER's noise: five sentences repeated.
    #[default]
    Noise,
    /// Sentences of a text file ([`HaystackText`]); `None`: WikiText-2's
    /// test split from the shared folder ([`default_haystack_path`]).
    Text(Option<PathBuf>),
}

impl Haystack {
    /// Parses a `haystack=` value: `noise`, `text` or `text:FILE`.
    pub fn parse(v: &str) -> std::result::Result<Self, String> {
        match v.trim() {
            "noise" => Ok(Haystack::Noise),
            "text" => Ok(Haystack::Text(None)),
            v => match v.strip_prefix("text:").map(str::trim) {
                Some("") => {
                    Err("`haystack=text:` needs a file after the colon (or `haystack=text` for WikiText-2)".into())
                }
                Some(f) => Ok(Haystack::Text(Some(PathBuf::from(f)))),
                None => Err(format!("`haystack={v}` is not a haystack (noise, text or text:FILE)")),
            },
        }
    }

    /// The `haystack=` value; `short`: the file's name only (result files'
    /// task column), else its whole path (parses back).
    pub fn render(&self, short: bool) -> String {
        match self {
            Haystack::Noise => "noise".into(),
            Haystack::Text(None) => "text".into(),
            Haystack::Text(Some(p)) if short => {
                format!(
                    "text:{}",
                    p.file_name().map_or_else(|| p.display().to_string(), |f| f.to_string_lossy().into())
                )
            }
            Haystack::Text(Some(p)) => format!("text:{}", p.display()),
        }
    }

    /// The file a text haystack reads (`None` for noise); errors when the
    /// default WikiText-2 file is nowhere to be found.
    pub fn file(&self) -> Result<Option<PathBuf>> {
        match self {
            Haystack::Noise => Ok(None),
            Haystack::Text(Some(p)) => Ok(Some(p.clone())),
            Haystack::Text(None) => default_haystack_path().map(Some),
        }
    }
}

/// WikiText-2's test split inside the shared folder.
pub const WIKITEXT_TEST: &str = "data/wikitext2/wiki.test.raw";

/// Where `haystack=text` finds WikiText-2's test split
/// ([`WIKITEXT_TEST`] inside the shared folder): under `$KVSLIM_SHARED`
/// when it is set, else under `../shared` from the working directory (the
/// repository's root, where the docs run `kvslim`), else under the
/// `shared/` beside the source checkout this crate was built from (where
/// the tests find it, as `testing/shared_dir.rs` does). Errors name every
/// place tried.
pub fn default_haystack_path() -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var_os("KVSLIM_SHARED") {
        Some(dir) => vec![PathBuf::from(dir).join(WIKITEXT_TEST)],
        None => vec![
            Path::new("../shared").join(WIKITEXT_TEST),
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared").join(WIKITEXT_TEST),
        ],
    };
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
        EvalError::Request(format!(
            "haystack=text reads WikiText-2's test split, which is not at {}: set KVSLIM_SHARED to the shared \
             folder or give a file with haystack=text:FILE",
            tried.join(" nor ")
        ))
    })
}

/// The share of a haystack file, in percent of its bytes (whole lines
/// only), that text haystacks read: the part calibration leaves out (see
/// the module docs).
pub const HELD_OUT_PERCENT: usize = 45;

/// A text haystack's sentences, in text order, and where its paragraphs
/// start (see the module docs for how a text becomes sentences).
#[derive(Clone, Debug, PartialEq)]
pub struct HaystackText {
    pub(super) sentences: Vec<String>,
    /// Index of each paragraph's first sentence (0 first).
    pub(super) paragraphs: Vec<usize>,
}

impl HaystackText {
    /// Reads `path` (UTF-8, or bzip2 of it), CRLF as LF, and keeps the
    /// sentences of its first [`HELD_OUT_PERCENT`]% ([`Self::from_text`]).
    /// Errors when that part holds no sentence.
    pub fn load(path: &Path) -> Result<Self> {
        let text = read_text(path)?.replace("\r\n", "\n");
        let t = Self::from_text(&text[..held_out_end(&text)]);
        if t.sentences.is_empty() {
            return Err(EvalError::File {
                path: path.into(),
                reason: format!(
                    "no sentence without a run of 3 or more digits in the whole lines of its first {HELD_OUT_PERCENT}% \
                     (a text haystack reads only those)"
                ),
            });
        }
        Ok(t)
    }

    /// All of `text` as a haystack: one paragraph per line, headings and
    /// empty lines skipped, WikiText's tokenization undone, sentences with
    /// a run of 3 or more digits dropped.
    pub fn from_text(text: &str) -> Self {
        let (mut sentences, mut paragraphs) = (Vec::new(), Vec::new());
        for line in text.lines().map(str::trim) {
            if line.is_empty() || (line.starts_with('=') && line.ends_with('=')) {
                continue;
            }
            let first = sentences.len();
            sentences.extend(sentences_of(line).into_iter().filter(|s| !has_digit_run(s, 3)));
            if sentences.len() > first {
                paragraphs.push(first);
            }
        }
        HaystackText { sentences, paragraphs }
    }

    /// The sentences, in text order.
    pub fn sentences(&self) -> &[String] {
        &self.sentences
    }

    /// How many paragraphs (an item starts at one of them).
    pub fn paragraphs(&self) -> usize {
        self.paragraphs.len()
    }
}

/// The end of the part of `text` a haystack reads: after the last line
/// break within its first [`HELD_OUT_PERCENT`]% bytes (0 when none).
pub(super) fn held_out_end(text: &str) -> usize {
    let limit = text.len() * HELD_OUT_PERCENT / 100;
    text.as_bytes()[..limit].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
}

/// Whether `s` holds a run of `k` or more ASCII digits.
pub(super) fn has_digit_run(s: &str, k: usize) -> bool {
    let mut run = 0;
    s.bytes().any(|b| {
        run = if b.is_ascii_digit() { run + 1 } else { 0 };
        run >= k
    })
}

/// A paragraph's sentences, WikiText's tokenization undone (see the module
/// docs).
fn sentences_of(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    // the next word follows the previous one without a space
    let mut glued = false;
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.next() {
        let (w, joins) = match w {
            "@-@" => ("-", true),
            "@,@" => (",", true),
            "@.@" => (".", true),
            w => (w, false),
        };
        let clitic = w == "n't"
            || (w.len() > 1 && w.len() <= 3 && w.starts_with('\'') && w[1..].chars().all(char::is_alphabetic));
        let attach = glued || joins || clitic || matches!(w, "," | "." | ";" | ":" | "?" | "!" | ")" | "]" | "%");
        if !cur.is_empty() && !attach {
            cur.push(' ');
        }
        cur.push_str(w);
        glued = joins || w == "(" || w == "[";
        let capital_next = words.peek().and_then(|n| n.chars().next()).is_some_and(|c| c.is_uppercase() || c == '"');
        let ends =
            (matches!(w, "." | "?" | "!") && !joins) || (w.len() > 1 && w.ends_with(['.', '?', '!']) && capital_next);
        if ends {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}
