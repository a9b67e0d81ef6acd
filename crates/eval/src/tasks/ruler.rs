//! Synthetic long-context tasks in the style of RULER (Hsieh et al.,
//! 2024), made locally from a seed, no download: a needle (or several) in
//! repetitive filler at a chosen depth, asked for at the end, and answered
//! by greedy generation, scored by exact match of every expected answer.
//!
//! * `passkey` — a 5-digit pass key (the classic; unchanged items).
//! * `niah_single` — one "special magic number" for a key (7 digits).
//! * `niah_multikey` — four needles with different keys; one is asked for,
//!   the other three are distractors spread over the context.
//! * `niah_multivalue` — four numbers for the same key; all are asked for.
//! * `vt` — variable tracking: `VAR A = 12345.`, `VAR B = VAR A.`, … (four
//!   hops spread from the depth to the end); every variable holding the
//!   value is asked for (multi-hop).
//! * `niah_multiquery` — compress once, ask many: four needles with
//!   different keys in a context that ends without a question; each key is
//!   then asked for in its own question after the context (the cache is
//!   compressed once, before any question is known).
//! * `cwe` — common-word extraction: a numbered list where ten words occur
//!   eight times each and the others three times; the ten are asked for.
//!   The depth has no meaning here and is ignored.
//!
//! Items are a pure function of the configuration and the token counter
//! (and, for a text haystack, the text file's contents); the prompt's
//! filler grows until the prompt fills its target length.
//!
//! ## Haystacks
//!
//! Every needle task (all but `cwe`, whose context is its word list) comes
//! in two haystacks, chosen by [`RulerConfig::haystack`] (`haystack=` in the
//! task spec):
//!
//! * `noise` (the default): RULER's noise, five sentences repeated ("The
//!   grass is green. The sky is blue. …"). Its items are the ones this
//!   module always made, bit for bit.
//! * `text`: real text ([`HaystackText`]), by default WikiText-2's test
//!   split from the shared folder ([`default_haystack_path`]), or any UTF-8
//!   file (`haystack=text:FILE`, one paragraph per line). Policies that win
//!   on repeated noise, where every filler token is predictable and a
//!   needle stands out, can lose on real text.
//!
//! **Held out from calibration.** `kvslim tune` cuts its tune windows from
//! the second half of its `--text` tokens (`--skip-tokens`, default half),
//! `kvslim calibrate --max-kl` its quality windows from the second half,
//! and both leave the first half for evaluation (`ppl:FILE,limit=K` reads
//! windows from token 0). A text haystack therefore reads only the first
//! [`HELD_OUT_PERCENT`]% of its file's bytes (whole lines; CRLF read as
//! LF): the first half with a margin for a token density that differs
//! between the halves (on WikiText-2's test split that part is 45.5% of
//! SmolLM2's tokens). The rule holds for every file, WikiText or not.
//! (CHAI's `kvslim calibrate` spreads its probe windows over the whole
//! text, but reads only each window's first `--probe` tokens, to cluster
//! heads.)
//!
//! **Text.** Lines are paragraphs; empty lines and headings (` = Title = `)
//! are skipped. WikiText's tokenization is undone (` @-@ ` → `-`, ` @,@ `
//! → `,`, ` @.@ ` → `.`, no space before `,` `.` `;` `:` `?` `!` `)` `%`,
//! `'s`, `n't`, none after `(`), and each paragraph is cut into sentences
//! (after `.`, `?` or `!` standing alone or ending a word before a capital).
//! **Numbers:** every sentence holding a run of 3 or more ASCII digits is
//! dropped (years, counts, `1,000`), so the haystack's own numbers are at
//! most two digits long and cannot be mistaken for a needle's 5- or 7-digit
//! value; a paragraph left without sentences is dropped. Each item starts
//! at a paragraph drawn from the item's own generator (the one that draws
//! its needles, after them, so a text item has the same needles as the
//! noise item of its cell) and takes consecutive sentences, wrapping to the
//! start when the text runs out, paragraphs kept as lines, until one more
//! sentence would pass the target length; needles go between sentences at
//! their depth, as in noise (the boundary nearest to that share of the
//! filler's bytes, since sentences differ in length).

use super::read_text;
use crate::{EvalError, Result};
use kvslim_cache::rng::SplitMix64;
use std::path::{Path, PathBuf};

/// Which task to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RulerTask {
    Passkey,
    NiahSingle,
    NiahMultiKey,
    NiahMultiValue,
    NiahMultiQuery,
    VariableTracking,
    CommonWords,
}

impl RulerTask {
    /// (New tasks go last: the position salts the items' draws.)
    pub const ALL: [RulerTask; 7] = [
        RulerTask::Passkey,
        RulerTask::NiahSingle,
        RulerTask::NiahMultiKey,
        RulerTask::NiahMultiValue,
        RulerTask::VariableTracking,
        RulerTask::CommonWords,
        RulerTask::NiahMultiQuery,
    ];

    /// The task-spec name.
    pub fn name(self) -> &'static str {
        match self {
            RulerTask::Passkey => "passkey",
            RulerTask::NiahSingle => "niah_single",
            RulerTask::NiahMultiKey => "niah_multikey",
            RulerTask::NiahMultiValue => "niah_multivalue",
            RulerTask::NiahMultiQuery => "niah_multiquery",
            RulerTask::VariableTracking => "vt",
            RulerTask::CommonWords => "cwe",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == s)
    }

    /// Tokens generated for the answer unless the spec says `max_tokens=`:
    /// room for every expected answer.
    pub fn default_max_tokens(self) -> usize {
        match self {
            RulerTask::Passkey => 10,
            RulerTask::NiahSingle | RulerTask::NiahMultiKey | RulerTask::NiahMultiQuery => 16,
            RulerTask::NiahMultiValue | RulerTask::VariableTracking => 48,
            RulerTask::CommonWords => 64,
        }
    }
}

/// Which items to make.
#[derive(Clone, Debug, PartialEq)]
pub struct RulerConfig {
    pub task: RulerTask,
    /// Target prompt lengths in tokens (as counted by the caller's counter).
    pub lengths: Vec<usize>,
    /// Needle depths as fractions of the filler: 0 = right after the
    /// instructions, 1 = just before the question.
    pub depths: Vec<f64>,
    /// Items per (length, depth) cell, each with its own needles.
    pub per_cell: usize,
    pub seed: u64,
    /// What fills the context around the needles (ignored by `cwe`).
    pub haystack: Haystack,
}

impl RulerConfig {
    /// The defaults: lengths 256/512/1024, five depths, two items per cell,
    /// the noise haystack.
    pub fn new(task: RulerTask) -> Self {
        RulerConfig {
            task,
            lengths: vec![256, 512, 1024],
            depths: vec![0.0, 0.25, 0.5, 0.75, 1.0],
            per_cell: 2,
            seed: 0,
            haystack: Haystack::Noise,
        }
    }
}

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
    sentences: Vec<String>,
    /// Index of each paragraph's first sentence (0 first).
    paragraphs: Vec<usize>,
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
fn held_out_end(text: &str) -> usize {
    let limit = text.len() * HELD_OUT_PERCENT / 100;
    text.as_bytes()[..limit].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
}

/// Whether `s` holds a run of `k` or more ASCII digits.
fn has_digit_run(s: &str, k: usize) -> bool {
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

/// The filler of one item's prompt.
#[derive(Clone, Copy)]
enum Filler<'a> {
    Noise,
    /// Sentences of `text` from sentence `start` on (wrapping around).
    Text {
        text: &'a HaystackText,
        start: usize,
    },
}

impl Filler<'_> {
    /// How many of `n` units precede a needle at depth `d`: `round(d·n)`
    /// noise sentences; in text, whose sentences differ in length, the
    /// sentence boundary nearest to `d` of the filler's bytes.
    fn at(&self, d: f64, n: usize) -> usize {
        let d = d.clamp(0.0, 1.0);
        match *self {
            Filler::Noise => ((d * n as f64).round() as usize).min(n),
            Filler::Text { text, start } => {
                let len = |i: usize| (text.sentences[(start + i) % text.sentences.len()].len() + 1) as f64;
                let goal = d * (0..n).map(len).sum::<f64>();
                let (mut i, mut acc) = (0, 0.0);
                while i < n && (acc + len(i) - goal).abs() < (acc - goal).abs() {
                    acc += len(i);
                    i += 1;
                }
                i
            }
        }
    }

    /// Appends filler unit `i` (a sentence) with the space or line break
    /// before it.
    fn push(&self, s: &mut String, i: usize) {
        match *self {
            Filler::Noise => {
                s.push(' ');
                s.push_str(FILLER[i % FILLER.len()]);
            }
            Filler::Text { text, start } => {
                let j = (start + i) % text.sentences.len();
                let para = i == 0 || text.paragraphs.binary_search(&j).is_ok();
                s.push(if para { '\n' } else { ' ' });
                s.push_str(&text.sentences[j]);
            }
        }
    }
}

/// One item.
#[derive(Clone, Debug, PartialEq)]
pub struct RulerItem {
    pub prompt: String,
    /// Every string the answer must contain (whole words or numbers).
    pub answers: Vec<String>,
    pub target_len: usize,
    pub depth: f64,
    /// Filler units in the prompt (sentences; distinct rare words for `cwe`).
    pub filler: usize,
    /// `niah_multiquery`: the prompt is the context alone, and each of these
    /// questions (asked after it, one at a time) expects `answers[i]`.
    pub questions: Vec<String>,
}

const HEADER: &str = "There is an important info hidden inside a lot of irrelevant text. \
Find it and memorize it. I will quiz you about the important information there.";
const NIAH_HEADER: &str = "Some special magic numbers are hidden within the following text. \
Make sure to memorize it. I will quiz you about the numbers afterwards.";
const VT_HEADER: &str = "Memorize and track the chain(s) of variable assignment hidden in the following text.";
const FILLER: [&str; 5] =
    ["The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again."];
/// The passkey prompt's last words; the answer should follow.
pub const QUESTION: &str = "What is the pass key? The pass key is";
/// Words the needles' keys and `cwe`'s common words are drawn from.
const WORDS: [&str; 64] = [
    "apple", "river", "stone", "candle", "garden", "window", "silver", "forest", "pencil", "rabbit", "cloud", "bridge",
    "orange", "mirror", "castle", "meadow", "basket", "feather", "lantern", "harbor", "violin", "pepper", "blanket",
    "marble", "turtle", "island", "rocket", "jacket", "button", "needle", "harvest", "copper", "garlic", "saddle",
    "wallet", "pillow", "thunder", "ladder", "helmet", "anchor", "carpet", "dragon", "falcon", "ginger", "hammer",
    "kettle", "lemon", "magnet", "napkin", "oyster", "parrot", "quiver", "ribbon", "spider", "tunnel", "velvet",
    "walnut", "yogurt", "zipper", "barrel", "cactus", "donkey", "engine", "fossil",
];

/// The passkey prompt with `n` noise sentences and the needle after
/// `round(depth · n)` of them.
pub fn passkey_prompt(key: &str, n: usize, depth: f64) -> String {
    passkey_in(&Filler::Noise, key, n, depth)
}

fn passkey_in(filler: &Filler, key: &str, n: usize, depth: f64) -> String {
    let needle = format!(" The pass key is {key}. Remember it. {key} is the pass key.");
    haystack(HEADER, filler, n, &[(depth, needle)], &format!("\n{QUESTION}"))
}

/// `header`, `n` filler sentences with each needle at its depth
/// ([`Filler::at`]; needles at the same place keep their order), then
/// `tail`.
fn haystack(header: &str, filler: &Filler, n: usize, needles: &[(f64, String)], tail: &str) -> String {
    let at = |d: f64| filler.at(d, n);
    let mut s = String::with_capacity(header.len() + tail.len() + n * 20 + needles.len() * 64);
    s.push_str(header);
    for i in 0..=n {
        for (d, text) in needles {
            if at(*d) == i {
                s.push_str(text);
            }
        }
        if i < n {
            filler.push(&mut s, i);
        }
    }
    s.push_str(tail);
    s
}

/// A pronounceable made-up word (distinct for distinct `i`), for `cwe`'s rare words.
fn rare_word(i: usize) -> String {
    const C: &[u8] = b"bdfgklmnprstvz";
    const V: &[u8] = b"aeiou";
    let mut w = String::new();
    let mut x = i + C.len() * V.len(); // at least two syllables
    while x > 0 {
        w.push(C[x % C.len()] as char);
        x /= C.len();
        w.push(V[x % V.len()] as char);
        x /= V.len();
    }
    w
}

/// What an item's prompt is built from, drawn once per item.
struct Draw {
    task: RulerTask,
    /// Keys (words or variable names) and values (numbers).
    keys: Vec<String>,
    values: Vec<String>,
    depth: f64,
    /// Shuffles `cwe`'s list.
    seed: u64,
}

impl Draw {
    fn new(task: RulerTask, rng: &mut SplitMix64, depth: f64) -> Self {
        let mut distinct_words = |k: usize| {
            let mut out: Vec<String> = Vec::new();
            while out.len() < k {
                let w = WORDS[rng.next_u64() as usize % WORDS.len()];
                if !out.iter().any(|o| o == w) {
                    out.push(w.to_string());
                }
            }
            out
        };
        let (keys, values) = match task {
            RulerTask::Passkey => (Vec::new(), vec![(10_000 + rng.next_u64() % 90_000).to_string()]),
            RulerTask::NiahSingle | RulerTask::NiahMultiKey | RulerTask::NiahMultiValue | RulerTask::NiahMultiQuery => {
                let n_keys = if matches!(task, RulerTask::NiahMultiKey | RulerTask::NiahMultiQuery) { 4 } else { 1 };
                let keys: Vec<String> =
                    distinct_words(2 * n_keys).chunks(2).map(|p| format!("{}-{}", p[0], p[1])).collect();
                let n_values = if task == RulerTask::NiahSingle { 1 } else { 4 };
                let values = (0..n_values).map(|_| (1_000_000 + rng.next_u64() % 9_000_000).to_string()).collect();
                (keys, values)
            }
            RulerTask::VariableTracking => {
                let mut names: Vec<String> = Vec::new();
                while names.len() < 5 {
                    let n: String = (0..5).map(|_| (b'A' + (rng.next_u64() % 26) as u8) as char).collect();
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
                (names, vec![(10_000 + rng.next_u64() % 90_000).to_string()])
            }
            RulerTask::CommonWords => (distinct_words(10), Vec::new()),
        };
        Draw { task, keys, values, depth, seed: rng.next_u64() }
    }

    /// What the answer must contain.
    fn answers(&self) -> Vec<String> {
        match self.task {
            RulerTask::Passkey | RulerTask::NiahSingle | RulerTask::NiahMultiKey => vec![self.values[0].clone()],
            RulerTask::NiahMultiValue | RulerTask::NiahMultiQuery => self.values.clone(),
            RulerTask::VariableTracking | RulerTask::CommonWords => self.keys.clone(),
        }
    }

    /// `niah_multiquery`'s questions, one per key, in the keys' order.
    fn questions(&self) -> Vec<String> {
        match self.task {
            RulerTask::NiahMultiQuery => self.keys.iter().map(|k| niah_question(k)).collect(),
            _ => Vec::new(),
        }
    }

    /// The prompt with `n` filler units.
    fn prompt(&self, filler: &Filler, n: usize) -> String {
        let d = self.depth;
        // the other needles spread evenly around the context from the depth
        let spread = |i: usize, of: usize| (d + i as f64 / of as f64).fract();
        let magic = |k: &str, v: &str| format!(" One of the special magic numbers for {k} is: {v}.");
        match self.task {
            RulerTask::Passkey => passkey_in(filler, &self.values[0], n, d),
            RulerTask::NiahSingle | RulerTask::NiahMultiKey => {
                let k = &self.keys[0];
                let mut needles = vec![(d, magic(k, &self.values[0]))];
                for (i, other) in self.keys.iter().enumerate().skip(1) {
                    let v = format!("{}", 1_000_000 + (self.seed >> (i * 8)) % 9_000_000);
                    needles.push((spread(i, self.keys.len()), magic(other, &v)));
                }
                haystack(NIAH_HEADER, filler, n, &needles, &format!("\n{}", niah_question(k)))
            }
            RulerTask::NiahMultiQuery => {
                let needles: Vec<(f64, String)> = (self.keys.iter().zip(&self.values).enumerate())
                    .map(|(i, (k, v))| (spread(i, self.keys.len()), magic(k, v)))
                    .collect();
                haystack(NIAH_HEADER, filler, n, &needles, "\n")
            }
            RulerTask::NiahMultiValue => {
                let k = &self.keys[0];
                let needles: Vec<(f64, String)> =
                    self.values.iter().enumerate().map(|(i, v)| (spread(i, self.values.len()), magic(k, v))).collect();
                let q = format!(
                    "\nWhat are all the special magic numbers for {k} mentioned in the provided text? \
                     The special magic numbers for {k} mentioned in the provided text are"
                );
                haystack(NIAH_HEADER, filler, n, &needles, &q)
            }
            RulerTask::VariableTracking => {
                let (names, value) = (&self.keys, &self.values[0]);
                let hops = names.len() - 1;
                let mut needles = vec![(d, format!(" VAR {} = {value}.", names[0]))];
                for i in 1..names.len() {
                    let at = d + (1.0 - d) * i as f64 / hops as f64;
                    needles.push((at, format!(" VAR {} = VAR {}.", names[i], names[i - 1])));
                }
                let q = format!(
                    "\nQuestion: Find all variables that are assigned the value {value} in the text above. \
                     Answer: According to the chain(s) of variable assignment in the text above, {} variables \
                     are assigned the value {value}, they are:",
                    names.len()
                );
                haystack(VT_HEADER, filler, n, &needles, &q)
            }
            RulerTask::CommonWords => {
                let mut list: Vec<String> = Vec::with_capacity(80 + 3 * n);
                for w in &self.keys {
                    list.extend(std::iter::repeat_n(w.clone(), 8));
                }
                for i in 0..n {
                    list.extend(std::iter::repeat_n(rare_word(i), 3));
                }
                let mut rng = SplitMix64::new(self.seed);
                for i in (1..list.len()).rev() {
                    list.swap(i, rng.next_u64() as usize % (i + 1));
                }
                let mut s = String::from(
                    "Below is a numbered list of words. In these words, some appear more often than others. \
                     Memorize the ones that appear most often.\n",
                );
                for (i, w) in list.iter().enumerate() {
                    s.push_str(&format!("{}. {w} ", i + 1));
                }
                s.push_str(
                    "\nQuestion: What are the 10 most common words in the above list? \
                     Answer: The top 10 words that appear most often in the list are:",
                );
                s
            }
        }
    }
}

/// The question for key `k`'s special magic number.
fn niah_question(k: &str) -> String {
    format!(
        "What is the special magic number for {k} mentioned in the provided text? \
         The special magic number for {k} mentioned in the provided text is"
    )
}

/// The most filler units whose prompt counts at most `target` tokens (0
/// when even the bare prompt is longer).
fn fit(build: &dyn Fn(usize) -> String, target: usize, count: &dyn Fn(&str) -> usize) -> usize {
    let base = count(&build(0));
    if base >= target {
        return 0;
    }
    let probe = 50;
    let per = (count(&build(probe)).saturating_sub(base) as f64 / probe as f64).max(0.1);
    let mut n = ((target - base) as f64 / per) as usize;
    loop {
        let c = count(&build(n));
        if c <= target || n == 0 {
            break;
        }
        n = n.saturating_sub((((c - target) as f64 / per).ceil() as usize).max(1));
    }
    while count(&build(n + 1)) <= target {
        n += 1;
    }
    n
}

/// [`fit`] for filler units of varying length (a text haystack's
/// sentences): the most units whose prompt counts at most `target` tokens,
/// assuming counts grow with units, found by interpolating between the
/// most units known to fit and the fewest known not to (a few counts
/// where stepping one sentence at a time would take hundreds).
fn fit_growing(build: &dyn Fn(usize) -> String, target: usize, count: &dyn Fn(&str) -> usize) -> usize {
    let base = count(&build(0));
    if base >= target {
        return 0;
    }
    // `lo` units fit with `c_lo` tokens; `hi` units (with their count) do not
    let (mut lo, mut c_lo, mut hi) = (0usize, base, None::<(usize, usize)>);
    let mut n = 32;
    loop {
        let c = count(&build(n));
        if c <= target {
            (lo, c_lo) = (n, c);
        } else {
            hi = Some((n, c));
        }
        n = match hi {
            Some((h, _)) if h <= lo + 1 => return lo,
            Some((h, c_h)) => {
                let step = (target - c_lo) as f64 * (h - lo) as f64 / c_h.saturating_sub(c_lo).max(1) as f64;
                (lo + (step as usize).max(1)).min(h - 1)
            }
            None => {
                let per = (c_lo.saturating_sub(base) as f64 / lo as f64).max(0.1);
                lo + (((target - c_lo) as f64 / per).ceil() as usize).max(1)
            }
        };
    }
}

/// Items for every length × depth × `per_cell`, in that order (`cwe`: one
/// depth, 0). Each prompt has as much filler as fits its target length
/// under `count_tokens` (which should count what the model will see, BOS
/// included). Needles are drawn from `seed`, the task and the cell, so
/// adding lengths or depths does not change the other items.
///
/// # Panics
///
/// When `cfg.haystack` is a text whose file cannot be read
/// ([`try_ruler_items`] returns that error instead).
pub fn ruler_items(cfg: &RulerConfig, count_tokens: &dyn Fn(&str) -> usize) -> Vec<RulerItem> {
    try_ruler_items(cfg, count_tokens).unwrap_or_else(|e| panic!("{e}"))
}

/// [`ruler_items`], reading a text haystack's file ([`HaystackText::load`]
/// of [`Haystack::file`]) and failing when it cannot.
pub fn try_ruler_items(cfg: &RulerConfig, count_tokens: &dyn Fn(&str) -> usize) -> Result<Vec<RulerItem>> {
    let file = if cfg.task == RulerTask::CommonWords { None } else { cfg.haystack.file()? };
    let text = file.map(|path| HaystackText::load(&path)).transpose()?;
    Ok(make_items(cfg, text.as_ref(), count_tokens))
}

/// [`ruler_items`] with `text` as the haystack, whatever `cfg.haystack`
/// says (`cwe` has none and ignores it).
///
/// # Panics
///
/// When `text` holds no sentence ([`HaystackText::load`] refuses such a
/// file).
pub fn ruler_items_in(cfg: &RulerConfig, text: &HaystackText, count_tokens: &dyn Fn(&str) -> usize) -> Vec<RulerItem> {
    assert!(!text.sentences.is_empty(), "a text haystack without sentences");
    make_items(cfg, Some(text), count_tokens)
}

/// Every item's length, depth, draw and filler, in [`ruler_items`]' order.
fn plan<'a>(cfg: &RulerConfig, text: Option<&'a HaystackText>) -> Vec<(usize, f64, Draw, Filler<'a>)> {
    let task_salt = RulerTask::ALL.iter().position(|&t| t == cfg.task).unwrap_or(0) as u64;
    let depths = if cfg.task == RulerTask::CommonWords { vec![0.0] } else { cfg.depths.clone() };
    let mut out = Vec::new();
    for &len in &cfg.lengths {
        for &depth in &depths {
            for rep in 0..cfg.per_cell {
                // (passkey, salt 0, keeps the keys it always had)
                let mut rng = SplitMix64::new(
                    cfg.seed
                        ^ (len as u64).wrapping_mul(0x1000_0000_01B3)
                        ^ depth.to_bits().rotate_left(17)
                        ^ rep as u64
                        ^ task_salt.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                );
                let _ = rng.next_u64();
                let draw = Draw::new(cfg.task, &mut rng, depth);
                // the text's start is drawn after the needles: a text item
                // keeps the needles of its cell's noise item
                let filler = match text {
                    Some(text) => {
                        let p = text.paragraphs[(rng.next_u64() % text.paragraphs.len() as u64) as usize];
                        Filler::Text { text, start: p }
                    }
                    None => Filler::Noise,
                };
                out.push((len, depth, draw, filler));
            }
        }
    }
    out
}

fn make_items(cfg: &RulerConfig, text: Option<&HaystackText>, count_tokens: &dyn Fn(&str) -> usize) -> Vec<RulerItem> {
    plan(cfg, text)
        .into_iter()
        .map(|(len, depth, draw, filler)| {
            let build = |n| draw.prompt(&filler, n);
            let n = match filler {
                Filler::Text { .. } if cfg.task != RulerTask::CommonWords => fit_growing(&build, len, count_tokens),
                _ => fit(&build, len, count_tokens),
            };
            RulerItem {
                prompt: draw.prompt(&filler, n),
                answers: draw.answers(),
                target_len: len,
                depth,
                filler: n,
                questions: draw.questions(),
            }
        })
        .collect()
}

/// How many of `answers` occur in `generated` as whole words or numbers
/// (not inside a longer one), ignoring ASCII case.
pub fn answers_found(generated: &str, answers: &[String]) -> usize {
    let text = generated.to_ascii_lowercase();
    answers
        .iter()
        .filter(|a| {
            let a = a.to_ascii_lowercase();
            text.match_indices(&a).any(|(i, _)| {
                let before = text[..i].chars().next_back();
                let after = text[i + a.len()..].chars().next();
                !before.is_some_and(|c| c.is_alphanumeric()) && !after.is_some_and(|c| c.is_alphanumeric())
            })
        })
        .count()
}

// the shared folder, found as every crate's tests find it
#[cfg(test)]
#[path = "../../../../testing/shared_dir.rs"]
mod shared_dir;

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    fn cfg(task: RulerTask) -> RulerConfig {
        RulerConfig {
            lengths: vec![100, 400],
            depths: vec![0.0, 0.5, 1.0],
            per_cell: 2,
            seed: 7,
            ..RulerConfig::new(task)
        }
    }

    #[test]
    fn passkey_items_are_deterministic_and_fit_their_length() {
        let c = cfg(RulerTask::Passkey);
        let a = ruler_items(&c, &words);
        assert_eq!(a, ruler_items(&c, &words));
        assert_eq!(a.len(), 12);
        for it in &a {
            let key = &it.answers[0];
            assert_eq!((it.answers.len(), key.len()), (1, 5));
            assert!(key.bytes().all(|b| b.is_ascii_digit()));
            let n = words(&it.prompt);
            assert!(n <= it.target_len && n + 5 > it.target_len, "{n} vs {}", it.target_len);
            assert!(it.prompt.ends_with(QUESTION));
            assert_eq!(it.prompt.matches(key.as_str()).count(), 2);
        }
        let other = ruler_items(&RulerConfig { seed: 8, ..c.clone() }, &words);
        assert_ne!(a[0].answers, other[0].answers);
        // the needle moves with depth
        let pos = |it: &RulerItem| it.prompt.find(&it.answers[0]).unwrap() as f64 / it.prompt.len() as f64;
        assert!(pos(&a[6]) < 0.2 && (0.35..0.65).contains(&pos(&a[8])) && pos(&a[10]) > 0.85);
        // too short a target still makes a (bare) prompt
        let tiny = RulerConfig { lengths: vec![5], depths: vec![0.5], per_cell: 1, ..c };
        assert_eq!(ruler_items(&tiny, &words)[0].filler, 0);
    }

    #[test]
    fn passkey_prompt_layout() {
        let p = passkey_prompt("12345", 2, 1.0);
        assert_eq!(
            p,
            format!("{HEADER} The grass is green. The sky is blue. The pass key is 12345. Remember it. 12345 is the pass key.\n{QUESTION}")
        );
    }

    #[test]
    fn every_task_fits_its_length_and_holds_its_answers() {
        for task in RulerTask::ALL {
            // (cwe's bare list of 80 words is over 100 words long)
            let c = RulerConfig { lengths: vec![300, 400], ..cfg(task) };
            let items = ruler_items(&c, &words);
            assert_eq!(items, ruler_items(&c, &words), "{task:?} is deterministic");
            let depths = if task == RulerTask::CommonWords { 1 } else { 3 };
            assert_eq!(items.len(), 2 * depths * 2, "{task:?}");
            for it in &items {
                let n = words(&it.prompt);
                assert!(n <= it.target_len, "{task:?}: {n} words for {}", it.target_len);
                if it.target_len == 400 {
                    assert!(it.filler > 10 && n + 30 > it.target_len, "{task:?}: {n} of {}", it.target_len);
                }
                let want = match task {
                    RulerTask::Passkey | RulerTask::NiahSingle | RulerTask::NiahMultiKey => 1,
                    RulerTask::NiahMultiValue | RulerTask::NiahMultiQuery => 4,
                    RulerTask::VariableTracking => 5,
                    RulerTask::CommonWords => 10,
                };
                assert_eq!(it.answers.len(), want, "{task:?}");
                assert_eq!(answers_found(&it.prompt, &it.answers), want, "{task:?}: every answer is in the prompt");
            }
            assert_ne!(items[0].answers, items[1].answers, "{task:?}: items of a cell differ");
        }
    }

    #[test]
    fn needles_and_distractors_are_where_they_should_be() {
        let it = &ruler_items(&cfg(RulerTask::NiahMultiKey), &words)[8]; // 400 words, depth 0.5
        assert_eq!(it.depth, 0.5);
        assert_eq!(it.prompt.matches("One of the special magic numbers for").count(), 4);
        let asked =
            it.prompt.rsplit("What is the special magic number for ").next().unwrap().split(' ').next().unwrap();
        let needle = format!("for {asked} is: {}.", it.answers[0]);
        let at = it.prompt.find(&needle).unwrap() as f64 / it.prompt.len() as f64;
        assert!((0.4..0.6).contains(&at), "the asked needle sits at the depth: {at}");
        let mv = &ruler_items(&cfg(RulerTask::NiahMultiValue), &words)[6];
        assert!(mv.prompt.contains("What are all the special magic numbers for"));
        // variable tracking: a chain from the value through every name, in order
        let vt = &ruler_items(&cfg(RulerTask::VariableTracking), &words)[6];
        let first = vt.prompt.find(&format!("VAR {} = ", vt.answers[0])).unwrap();
        for w in vt.answers.windows(2) {
            let hop = vt.prompt.find(&format!("VAR {} = VAR {}.", w[1], w[0])).expect("hop");
            assert!(hop > first);
        }
        // cwe: the ten answers eight times each, every other word three times
        let cw = &ruler_items(&cfg(RulerTask::CommonWords), &words)[2];
        let list = cw.prompt.split('\n').nth(1).unwrap();
        let mut counts = std::collections::HashMap::<&str, usize>::new();
        for w in list.split_whitespace().filter(|w| !w.ends_with('.')) {
            *counts.entry(w).or_default() += 1;
        }
        for a in &cw.answers {
            assert_eq!(counts[a.as_str()], 8, "{a}");
        }
        assert!(counts.iter().filter(|(w, _)| !cw.answers.iter().any(|a| a == *w)).all(|(_, &c)| c == 3));
    }

    #[test]
    fn multiquery_asks_each_key_after_a_context_without_a_question() {
        for it in &ruler_items(&cfg(RulerTask::NiahMultiQuery), &words) {
            assert!(!it.prompt.contains("What is"), "the context asks nothing");
            assert!(it.prompt.ends_with('\n'));
            assert_eq!((it.questions.len(), it.answers.len()), (4, 4));
            for (q, a) in it.questions.iter().zip(&it.answers) {
                let key = q.strip_prefix("What is the special magic number for ").unwrap().split(' ').next().unwrap();
                assert!(it.prompt.contains(&format!("for {key} is: {a}.")), "question {q} expects {a}");
            }
        }
        // the other tasks ask in the prompt
        assert!(ruler_items(&cfg(RulerTask::NiahMultiKey), &words).iter().all(|it| it.questions.is_empty()));
    }

    #[test]
    fn answers_match_whole_words_and_numbers() {
        let a = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(answers_found(" 48213. Remember", &a(&["48213"])), 1);
        assert_eq!(answers_found(" 482130", &a(&["48213"])), 0);
        assert_eq!(answers_found(" 4821", &a(&["48213"])), 0);
        assert_eq!(answers_found("1 48213 2", &a(&["48213"])), 1);
        assert_eq!(answers_found("They are: QWERT, ASDFG and zxcvb.", &a(&["QWERT", "ASDFG", "ZXCVB", "POIUY"])), 3);
        assert_eq!(answers_found("apples", &a(&["apple"])), 0);
    }

    /// FNV-1a over every item's prompt, answers, questions, filler, length
    /// and depth.
    fn digest(items: &[RulerItem]) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes.iter().chain(&[0xff]) {
                h ^= b as u64;
                h = h.wrapping_mul(0x100_0000_01b3);
            }
        };
        for it in items {
            eat(it.prompt.as_bytes());
            for a in it.answers.iter().chain(&it.questions) {
                eat(a.as_bytes());
            }
            eat(&(it.filler as u64).to_le_bytes());
            eat(&(it.target_len as u64).to_le_bytes());
            eat(&it.depth.to_bits().to_le_bytes());
        }
        h
    }

    #[test]
    fn noise_items_are_the_ones_made_before_haystacks() {
        // digests of the items the code made before `haystack=` existed
        // (commit of this module without it), per task: lengths 300/400/1000
        // under a word counter, and the defaults under a bytes/4 counter
        let before = [
            (RulerTask::Passkey, 0x4c44f70ebab45d55, 0x411a05b2130a8266),
            (RulerTask::NiahSingle, 0x0f51707229bded61, 0x2a0422610a07ef20),
            (RulerTask::NiahMultiKey, 0x77a7f743bc20ac51, 0x522479271fb097c1),
            (RulerTask::NiahMultiValue, 0x6e6132adfc7530d3, 0xde861da2498d2d6a),
            (RulerTask::VariableTracking, 0x6a2bf7fe8354ba22, 0x16f5a685443a3f0e),
            (RulerTask::CommonWords, 0x595ad01de06cc004, 0xdbcd27a72674b04e),
            (RulerTask::NiahMultiQuery, 0xa8b2168f34d95826, 0x092be953e257d38c),
        ];
        let quarter = |s: &str| s.len() / 4 + 1;
        for (task, a, d) in before {
            let c = RulerConfig {
                lengths: vec![300, 400, 1000],
                depths: vec![0.0, 0.25, 0.5, 1.0],
                per_cell: 2,
                seed: 7,
                ..RulerConfig::new(task)
            };
            assert_eq!(c.haystack, Haystack::Noise, "noise is the default");
            assert_eq!(digest(&ruler_items(&c, &words)), a, "{task:?}");
            assert_eq!(digest(&ruler_items(&RulerConfig::new(task), &quarter)), d, "{task:?} (defaults)");
            let explicit = RulerConfig { haystack: Haystack::parse("noise").unwrap(), ..c.clone() };
            assert_eq!(ruler_items(&explicit, &words), ruler_items(&c, &words), "{task:?}: haystack=noise");
        }
    }

    const WIKI: &str = " = Robert Boulter = \n Robert Boulter is an English film , television and theatre actor . \
He had a guest @-@ starring role on the television series The Bill in 2000 . He was cast in Teddy 's Story , \
which was n't long ( about 1 @.@ 5 hours ) . \n\n = = Career = = \n In 2006 , Boulter starred in 1 @,@ 000 plays . \n \
Boulter did 12 % of the work ; \" Craig \" did the rest : all of it ! Then what ? Nothing.\n";

    #[test]
    fn text_becomes_paragraphs_of_sentences_without_long_numbers() {
        let t = HaystackText::from_text(WIKI);
        assert_eq!(
            t.sentences(),
            [
                "Robert Boulter is an English film, television and theatre actor.",
                "He was cast in Teddy's Story, which wasn't long (about 1.5 hours).",
                "Boulter did 12% of the work; \" Craig \" did the rest: all of it!",
                "Then what?",
                "Nothing.",
            ]
        );
        // the 2000 and 1,000 sentences are gone; the line of 1,000 with them
        assert_eq!((t.paragraphs(), &t.paragraphs[..]), (2, &[0, 2][..]));
        assert!(!has_digit_run("12 and 34 and 1.5", 3) && has_digit_run("in 1990s", 3) && has_digit_run("1,000", 3));
        // held out: whole lines within the first 45% of the bytes
        let text = "aaaa\nbbbb\ncccc\ndddd\n"; // 20 bytes: 45% is 9, the first line's end
        assert_eq!(&text[..held_out_end(text)], "aaaa\n");
        assert_eq!(held_out_end("one long line"), 0);
    }

    /// WikiText-2's test split, which the tests need (`../shared` or
    /// `KVSLIM_SHARED`, as every crate's tests find it).
    fn wikitext() -> HaystackText {
        let p = super::shared_dir::shared().join(WIKITEXT_TEST);
        assert!(p.exists(), "{} is absent: the tests need ../shared (or KVSLIM_SHARED)", p.display());
        HaystackText::load(&p).unwrap()
    }

    /// Every run of 3 or more digits in `s`, sorted.
    fn digit_runs(s: &str) -> Vec<&str> {
        let mut v: Vec<&str> = s.split(|c: char| !c.is_ascii_digit()).filter(|r| r.len() >= 3).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn text_haystack_holds_the_noise_items_needles_once_at_their_depth() {
        let text = wikitext();
        assert!(text.sentences().len() > 2000 && text.paragraphs() > 500, "{}", text.sentences().len());
        // the whole pool is free of 3-digit runs and of the second half
        assert!(text.sentences().iter().all(|s| !has_digit_run(s, 3)));
        for task in RulerTask::ALL.into_iter().filter(|&t| t != RulerTask::CommonWords) {
            let c = RulerConfig { lengths: vec![400, 1500], ..cfg(task) };
            let items = ruler_items_in(&c, &text, &words);
            assert_eq!(items, ruler_items_in(&c, &text, &words), "{task:?} is deterministic");
            let noise = ruler_items(&c, &words);
            assert_eq!(items.len(), noise.len());
            for (it, nz) in items.iter().zip(&noise) {
                assert_eq!((&it.answers, &it.questions), (&nz.answers, &nz.questions), "{task:?}: the cell's needles");
                assert_ne!(it.prompt, nz.prompt);
                // the needles' numbers (and the question's), each as often as in
                // noise, and no other run of 3 or more digits
                assert_eq!(digit_runs(&it.prompt), digit_runs(&nz.prompt), "{task:?}");
                assert_eq!(answers_found(&it.prompt, &it.answers), it.answers.len(), "{task:?}");
                assert!(words(&it.prompt) <= it.target_len, "{task:?}");
                assert!(!it.prompt.contains("The grass is green"), "{task:?}");
            }
        }
        // the asked needle, once, at its depth in the filler
        let c =
            RulerConfig { lengths: vec![1500], depths: vec![0.0, 0.25, 0.5, 0.75, 1.0], ..cfg(RulerTask::NiahSingle) };
        for it in ruler_items_in(&c, &text, &words) {
            let needle = format!(" is: {}.", it.answers[0]);
            assert_eq!(it.prompt.matches(&needle).count(), 1);
            let (head, tail) = (NIAH_HEADER.len(), it.prompt.rfind("\nWhat is the special").unwrap());
            let at = (it.prompt.find(&needle).unwrap() - head) as f64 / (tail - head) as f64;
            assert!((at - it.depth).abs() < 0.03, "needle at {at:.3} for depth {}", it.depth);
            // between sentences: after the header or a sentence, before a space or line break
            let i = it.prompt.find(" One of the special magic numbers").unwrap();
            let before = &it.prompt[..i];
            assert!(i == head || text.sentences().iter().any(|s| before.ends_with(s.as_str())), "{before}");
            assert!(it.prompt[i + 1..].split_once(&needle).unwrap().1.starts_with([' ', '\n']));
        }
    }

    #[test]
    fn text_items_fill_their_length_to_a_sentence_and_differ_by_seed() {
        let text = wikitext();
        for task in [RulerTask::Passkey, RulerTask::NiahMultiKey, RulerTask::VariableTracking] {
            let c = RulerConfig { lengths: vec![300, 2000], ..cfg(task) };
            for (len, _, draw, filler) in plan(&c, Some(&text)) {
                let n = fit_growing(&|n| draw.prompt(&filler, n), len, &words);
                let it = draw.prompt(&filler, n);
                assert!(words(&it) <= len && words(&draw.prompt(&filler, n + 1)) > len, "{task:?}: {n} sentences");
                assert!(n > 5, "{task:?}: {n}");
            }
            let (a, b) = (
                ruler_items_in(&c, &text, &words),
                ruler_items_in(&RulerConfig { seed: 8, ..c.clone() }, &text, &words),
            );
            // each item starts at its own paragraph: seeds and the items of a cell differ
            let body = |it: &RulerItem| it.prompt.lines().nth(1).unwrap_or_default().to_string();
            assert!(a.iter().zip(&b).all(|(x, y)| body(x) != body(y)), "{task:?}");
            assert_ne!(body(&a[0]), body(&a[1]), "{task:?}");
        }
        // longer than the text: it wraps around
        let small = HaystackText::from_text("One. Two. Three.\nFour five. Six.\n");
        let c = RulerConfig { lengths: vec![200], depths: vec![0.5], per_cell: 1, ..cfg(RulerTask::Passkey) };
        let it = &ruler_items_in(&c, &small, &words)[0];
        assert!(it.filler > 40 && words(&it.prompt) <= 200 && it.prompt.matches("Four five.").count() > 5);
    }

    #[test]
    fn text_haystack_files_and_errors() {
        assert_eq!(Haystack::parse("text").unwrap(), Haystack::Text(None));
        assert_eq!(Haystack::parse("text:/a/b.txt").unwrap(), Haystack::Text(Some("/a/b.txt".into())));
        assert_eq!(Haystack::parse("text:/a/b.txt").unwrap().render(true), "text:b.txt");
        let e = Haystack::parse("bogus").unwrap_err();
        assert!(e.contains("`haystack=bogus` is not a haystack (noise, text or text:FILE)"), "{e}");
        assert!(Haystack::parse("text:").unwrap_err().contains("needs a file"));
        // the default file is WikiText-2's test split from the shared folder
        let p = Haystack::Text(None).file().unwrap().unwrap();
        assert!(p.ends_with(WIKITEXT_TEST), "{}", p.display());
        assert_eq!(HaystackText::load(&p).unwrap(), wikitext());
        let missing =
            RulerConfig { haystack: Haystack::Text(Some("/no/such/essays.txt".into())), ..cfg(RulerTask::NiahSingle) };
        let e = try_ruler_items(&missing, &words).unwrap_err().to_string();
        assert!(e.contains("/no/such/essays.txt"), "{e}");
        // a file of numbers has no sentence to offer
        let dir = std::env::temp_dir().join(format!("kvslim-eval-haystack-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("numbers.txt");
        std::fs::write(&f, "In 1999 it was 1000.\r\nIn 2000 it was 2000.\r\n".repeat(10)).unwrap();
        let e = HaystackText::load(&f).unwrap_err().to_string();
        assert!(e.contains("numbers.txt") && e.contains("no sentence"), "{e}");
        std::fs::write(&f, "A first line.\r\nA second line.\r\n".repeat(10)).unwrap();
        let own = RulerConfig { haystack: Haystack::Text(Some(f.clone())), ..cfg(RulerTask::NiahSingle) };
        let items = try_ruler_items(&own, &words).unwrap();
        assert!(items[4].prompt.contains("A second line.\nA first line.") && !items[4].prompt.contains('\r'));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
