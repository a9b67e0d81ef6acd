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
//! Items are a pure function of the configuration and the token counter;
//! the prompt's filler grows until the prompt fills its target length.

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
}

impl RulerConfig {
    /// The defaults: lengths 256/512/1024, five depths, two items per cell.
    pub fn new(task: RulerTask) -> Self {
        RulerConfig {
            task,
            lengths: vec![256, 512, 1024],
            depths: vec![0.0, 0.25, 0.5, 0.75, 1.0],
            per_cell: 2,
            seed: 0,
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

/// The passkey prompt with `n` filler sentences and the needle after
/// `round(depth · n)` of them.
pub fn passkey_prompt(key: &str, n: usize, depth: f64) -> String {
    let needle = format!(" The pass key is {key}. Remember it. {key} is the pass key.");
    haystack(HEADER, n, &[(depth, needle)], &format!("\n{QUESTION}"))
}

/// `header`, `n` filler sentences with each needle after `round(depth · n)`
/// of them (needles at the same place keep their order), then `tail`.
fn haystack(header: &str, n: usize, needles: &[(f64, String)], tail: &str) -> String {
    let at = |d: f64| ((d.clamp(0.0, 1.0) * n as f64).round() as usize).min(n);
    let mut s = String::with_capacity(header.len() + tail.len() + n * 20 + needles.len() * 64);
    s.push_str(header);
    for i in 0..=n {
        for (d, text) in needles {
            if at(*d) == i {
                s.push_str(text);
            }
        }
        if i < n {
            s.push(' ');
            s.push_str(FILLER[i % FILLER.len()]);
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
    fn prompt(&self, n: usize) -> String {
        let d = self.depth;
        // the other needles spread evenly around the context from the depth
        let spread = |i: usize, of: usize| (d + i as f64 / of as f64).fract();
        let magic = |k: &str, v: &str| format!(" One of the special magic numbers for {k} is: {v}.");
        match self.task {
            RulerTask::Passkey => passkey_prompt(&self.values[0], n, d),
            RulerTask::NiahSingle | RulerTask::NiahMultiKey => {
                let k = &self.keys[0];
                let mut needles = vec![(d, magic(k, &self.values[0]))];
                for (i, other) in self.keys.iter().enumerate().skip(1) {
                    let v = format!("{}", 1_000_000 + (self.seed >> (i * 8)) % 9_000_000);
                    needles.push((spread(i, self.keys.len()), magic(other, &v)));
                }
                haystack(NIAH_HEADER, n, &needles, &format!("\n{}", niah_question(k)))
            }
            RulerTask::NiahMultiQuery => {
                let needles: Vec<(f64, String)> = (self.keys.iter().zip(&self.values).enumerate())
                    .map(|(i, (k, v))| (spread(i, self.keys.len()), magic(k, v)))
                    .collect();
                haystack(NIAH_HEADER, n, &needles, "\n")
            }
            RulerTask::NiahMultiValue => {
                let k = &self.keys[0];
                let needles: Vec<(f64, String)> =
                    self.values.iter().enumerate().map(|(i, v)| (spread(i, self.values.len()), magic(k, v))).collect();
                let q = format!(
                    "\nWhat are all the special magic numbers for {k} mentioned in the provided text? \
                     The special magic numbers for {k} mentioned in the provided text are"
                );
                haystack(NIAH_HEADER, n, &needles, &q)
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
                haystack(VT_HEADER, n, &needles, &q)
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

/// Items for every length × depth × `per_cell`, in that order (`cwe`: one
/// depth, 0). Each prompt has as much filler as fits its target length
/// under `count_tokens` (which should count what the model will see, BOS
/// included). Needles are drawn from `seed`, the task and the cell, so
/// adding lengths or depths does not change the other items.
pub fn ruler_items(cfg: &RulerConfig, count_tokens: &dyn Fn(&str) -> usize) -> Vec<RulerItem> {
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
                let n = fit(&|n| draw.prompt(n), len, count_tokens);
                out.push(RulerItem {
                    prompt: draw.prompt(n),
                    answers: draw.answers(),
                    target_len: len,
                    depth,
                    filler: n,
                    questions: draw.questions(),
                });
            }
        }
    }
    out
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
mod tests {
    use super::*;

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    fn cfg(task: RulerTask) -> RulerConfig {
        RulerConfig { task, lengths: vec![100, 400], depths: vec![0.0, 0.5, 1.0], per_cell: 2, seed: 7 }
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
}
