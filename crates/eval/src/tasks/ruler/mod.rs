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

mod haystack;
mod task;

pub use haystack::{default_haystack_path, Haystack, HaystackText, HELD_OUT_PERCENT, WIKITEXT_TEST};
pub use task::{Ruler, KIND};

use crate::error::Result;
#[cfg(test)]
use haystack::{has_digit_run, held_out_end};
use kvslim_cache::rng::SplitMix64;

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

#[cfg(test)]
mod tests;
