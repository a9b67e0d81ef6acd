//! Synthetic long-context retrieval ("passkey"): a random 5-digit number
//! hidden at a given depth in repetitive filler text, asked for at the end.
//! Items are a pure function of the configuration and the token counter.

/// Which items to make.
#[derive(Clone, Debug, PartialEq)]
pub struct PasskeyConfig {
    /// Target prompt lengths in tokens (as counted by the caller's counter).
    pub lengths: Vec<usize>,
    /// Needle depths as fractions of the filler: 0 = right after the
    /// instructions, 1 = just before the question.
    pub depths: Vec<f64>,
    /// Items per (length, depth) cell, each with its own key.
    pub per_cell: usize,
    pub seed: u64,
}

impl Default for PasskeyConfig {
    fn default() -> Self {
        PasskeyConfig { lengths: vec![256, 512, 1024], depths: vec![0.0, 0.25, 0.5, 0.75, 1.0], per_cell: 2, seed: 0 }
    }
}

/// One retrieval item.
#[derive(Clone, Debug, PartialEq)]
pub struct PasskeyItem {
    pub prompt: String,
    /// The 5-digit key the answer must contain.
    pub key: String,
    pub target_len: usize,
    pub depth: f64,
    /// Filler sentences in the prompt.
    pub filler_sentences: usize,
}

const HEADER: &str = "There is an important info hidden inside a lot of irrelevant text. \
Find it and memorize it. I will quiz you about the important information there.";
const FILLER: [&str; 5] =
    ["The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again."];
/// The prompt's last words; the answer should follow.
pub const QUESTION: &str = "What is the pass key? The pass key is";

/// The prompt with `n` filler sentences and the needle after
/// `round(depth · n)` of them.
pub fn passkey_prompt(key: &str, n: usize, depth: f64) -> String {
    let at = ((depth.clamp(0.0, 1.0) * n as f64).round() as usize).min(n);
    let mut s = String::with_capacity(64 + n * 20);
    s.push_str(HEADER);
    for i in 0..=n {
        if i == at {
            s.push_str(" The pass key is ");
            s.push_str(key);
            s.push_str(". Remember it. ");
            s.push_str(key);
            s.push_str(" is the pass key.");
        }
        if i < n {
            s.push(' ');
            s.push_str(FILLER[i % FILLER.len()]);
        }
    }
    s.push('\n');
    s.push_str(QUESTION);
    s
}

/// The most filler sentences whose prompt counts at most `target` tokens
/// (0 when even the bare prompt is longer).
fn fit(key: &str, depth: f64, target: usize, count: &dyn Fn(&str) -> usize) -> usize {
    let base = count(&passkey_prompt(key, 0, depth));
    if base >= target {
        return 0;
    }
    let probe = 50;
    let per = (count(&passkey_prompt(key, probe, depth)).saturating_sub(base) as f64 / probe as f64).max(0.1);
    let mut n = ((target - base) as f64 / per) as usize;
    loop {
        let c = count(&passkey_prompt(key, n, depth));
        if c <= target || n == 0 {
            break;
        }
        n = n.saturating_sub((((c - target) as f64 / per).ceil() as usize).max(1));
    }
    while count(&passkey_prompt(key, n + 1, depth)) <= target {
        n += 1;
    }
    n
}

/// Items for every length × depth × `per_cell`, in that order. Each
/// prompt has as many filler sentences as fit in its target length under
/// `count_tokens` (which should count what the model will see, BOS
/// included). Keys are drawn from `seed` and the cell, so adding lengths
/// or depths does not change the other items.
pub fn passkey_items(cfg: &PasskeyConfig, count_tokens: &dyn Fn(&str) -> usize) -> Vec<PasskeyItem> {
    let mut out = Vec::new();
    for &len in &cfg.lengths {
        for &depth in &cfg.depths {
            for rep in 0..cfg.per_cell {
                let mut rng = kvslim_cache::rng::SplitMix64::new(
                    cfg.seed
                        ^ (len as u64).wrapping_mul(0x1000_0000_01B3)
                        ^ depth.to_bits().rotate_left(17)
                        ^ rep as u64,
                );
                let _ = rng.next_u64();
                let key = (10_000 + rng.next_u64() % 90_000).to_string();
                let n = fit(&key, depth, len, count_tokens);
                out.push(PasskeyItem {
                    prompt: passkey_prompt(&key, n, depth),
                    key,
                    target_len: len,
                    depth,
                    filler_sentences: n,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    #[test]
    fn items_are_deterministic_and_fit_their_length() {
        let cfg = PasskeyConfig { lengths: vec![100, 400], depths: vec![0.0, 0.5, 1.0], per_cell: 2, seed: 7 };
        let a = passkey_items(&cfg, &words);
        assert_eq!(a, passkey_items(&cfg, &words));
        assert_eq!(a.len(), 12);
        for it in &a {
            assert_eq!(it.key.len(), 5);
            assert!(it.key.bytes().all(|b| b.is_ascii_digit()));
            let n = words(&it.prompt);
            assert!(n <= it.target_len && n + 5 > it.target_len, "{n} vs {}", it.target_len);
            assert!(it.prompt.ends_with(QUESTION));
            assert_eq!(it.prompt.matches(&it.key).count(), 2);
        }
        let other = passkey_items(&PasskeyConfig { seed: 8, ..cfg.clone() }, &words);
        assert_ne!(a[0].key, other[0].key);
        // the needle moves with depth
        let pos = |it: &PasskeyItem| it.prompt.find(&it.key).unwrap() as f64 / it.prompt.len() as f64;
        assert!(pos(&a[6]) < 0.2 && (0.35..0.65).contains(&pos(&a[8])) && pos(&a[10]) > 0.85);
        // too short a target still makes a (bare) prompt
        let tiny = passkey_items(&PasskeyConfig { lengths: vec![5], depths: vec![0.5], per_cell: 1, seed: 0 }, &words);
        assert_eq!(tiny[0].filler_sentences, 0);
    }

    #[test]
    fn prompt_layout() {
        let p = passkey_prompt("12345", 2, 1.0);
        assert_eq!(
            p,
            format!("{HEADER} The grass is green. The sky is blue. The pass key is 12345. Remember it. 12345 is the pass key.\n{QUESTION}")
        );
    }
}
