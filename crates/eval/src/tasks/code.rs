//! Long-context code completion in the style of LongBench's LCC: a source
//! file's prefix (cut at a line boundary) is the prompt, the model
//! continues it, and the first line it writes is scored against the file's
//! next non-trivial line by exact match (both stripped) and by edit
//! similarity, 1 − Levenshtein distance / the longer length (in
//! characters). Items are jsonl `{"context", "answer"}` (other fields, such
//! as `file`, are kept for reference only).

use super::kind::{file_spec, positive, unless_default, GenerationItems, Kind, KvPeak, Prepared, Task};
use crate::cell::Cell;
use crate::error::{EvalError, Result};
use kvslim_models::{Model, Tokenizer};
use std::path::{Path, PathBuf};

/// One completion item.
#[derive(Clone, Debug, PartialEq)]
pub struct CodeItem {
    pub context: String,
    pub answer: String,
}

/// Reads `{"context", "answer"}` lines (blank lines skipped); a line that
/// is not such an object is an error naming its line number.
pub fn load_code_items(path: &Path) -> Result<Vec<CodeItem>> {
    let text = super::read_text(path)?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |why: String| EvalError::File { path: path.into(), reason: format!("line {}: {why}", i + 1) };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON ({e})")))?;
        let field = |k: &str| {
            v.get(k).and_then(|x| x.as_str()).map(String::from).ok_or_else(|| bad(format!("no string field `{k}`")))
        };
        let item = CodeItem { context: field("context")?, answer: field("answer")? };
        if item.context.is_empty() {
            return Err(bad("empty `context`".into()));
        }
        out.push(item);
    }
    if out.is_empty() {
        return Err(EvalError::File { path: path.into(), reason: "no items".into() });
    }
    Ok(out)
}

/// The first line of a continuation, as LCC scores it: leading blank lines
/// skipped, then everything up to the next newline.
pub fn first_line(generated: &str) -> &str {
    let rest = generated.trim_start_matches(['\n', '\r']);
    rest.split('\n').next().unwrap_or("").trim_end_matches('\r')
}

/// Levenshtein distance in characters (two rows of the DP table).
pub fn levenshtein(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// (exact match, edit similarity) of a predicted line against the answer,
/// both stripped of surrounding whitespace; two empty lines are a match.
pub fn score_line(predicted: &str, answer: &str) -> (bool, f64) {
    let (p, a) = (predicted.trim(), answer.trim());
    let longer = p.chars().count().max(a.chars().count());
    let sim = if longer == 0 { 1.0 } else { 1.0 - levenshtein(p, a) as f64 / longer as f64 };
    (p == a, sim)
}

/// Most tokens a code-completion item generates (its first line ends it).
pub const DEFAULT_LCC_TOKENS: usize = 64;

pub const KIND: Kind = Kind {
    names: &["lcc"],
    file: true,
    extensions: &[],
    options: "max_tokens, max_context, limit",
    headline: &["exact", "edit_sim"],
    new: |_, path| Box::new(Lcc { path, max_tokens: DEFAULT_LCC_TOKENS, max_context: None }),
};

/// `lcc:FILE[,max_tokens=N][,max_context=T]`: items with more than T
/// context tokens are left out, and `limit` counts the others.
#[derive(Clone, Debug, PartialEq)]
pub struct Lcc {
    pub path: PathBuf,
    pub max_tokens: usize,
    pub max_context: Option<usize>,
}

impl Task for Lcc {
    fn name(&self) -> &'static str {
        "lcc"
    }

    fn set(&mut self, key: &str, vals: &[&str]) -> Result<bool, String> {
        match key {
            "max_tokens" => self.max_tokens = positive(key, vals)?,
            "max_context" => self.max_context = Some(positive(key, vals)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn render(&self, short: bool) -> String {
        let max_context = self.max_context.map(|t| format!("max_context={t}"));
        file_spec(
            "lcc",
            &self.path,
            short,
            &[unless_default("max_tokens", self.max_tokens, DEFAULT_LCC_TOKENS), max_context],
        )
    }

    fn prepare(&self, model: &Model, tok: &Tokenizer, limit: Option<usize>) -> Result<Box<dyn Prepared>> {
        let items = load_code_items(&self.path)?;
        let (ctx, max_tokens, limit) = (model.config.context_len, self.max_tokens, limit.unwrap_or(usize::MAX));
        let mut out = Vec::with_capacity(items.len());
        for (i, it) in items.iter().enumerate() {
            let ids = tok.encode(&it.context)?;
            if self.max_context.is_some_and(|t| ids.len() > t) {
                continue;
            }
            if out.len() == limit {
                break;
            }
            if ids.len() + max_tokens > ctx {
                return Err(EvalError::Request(format!(
                    "lcc item {} has {} context tokens; with {max_tokens} new ones they exceed the model's context of {ctx}",
                    i + 1,
                    ids.len()
                )));
            }
            out.push((ids, it.answer.clone()));
        }
        Ok(Box::new(Completions { items: out, max_tokens }))
    }
}

/// Context ids and the expected next line.
struct Completions {
    items: Vec<(Vec<u32>, String)>,
    max_tokens: usize,
}

impl Prepared for Completions {
    fn items(&self) -> usize {
        self.items.len()
    }

    fn generation(&self) -> Option<GenerationItems<'_>> {
        Some((self.items.iter().map(|it| (&it.0[..], &[][..])).collect(), self.max_tokens, true))
    }

    /// `exact` and `edit_sim` of each item's first generated line.
    fn run(&mut self, cell: &mut Cell<'_>) -> Result<KvPeak> {
        let gens = cell.generations(self.generation().expect("a generation task"))?;
        let mut peak = KvPeak::default();
        let scored = gens
            .iter()
            .zip(self.items.iter())
            .map(|(g, (_, answer))| {
                let g = &g[0];
                let line = cell.tok.decode(&g.token_ids)?;
                Ok((score_line(first_line(&line), answer), g.kv_bytes))
            })
            .collect::<Result<Vec<_>>>()?;
        let (mut exact, mut sim) = (Vec::with_capacity(scored.len()), Vec::with_capacity(scored.len()));
        for ((hit, s), b) in &scored {
            peak.see(b.kv, b.metadata);
            exact.push(f64::from(u8::from(*hit)));
            sim.push(*s);
        }
        cell.row.per_item_mean("exact", exact);
        cell.row.per_item_mean("edit_sim", sim);
        Ok(peak)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levenshtein_known_values() {
        assert_eq!(levenshtein("", ""), 0);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("flaw", "lawn"), 2);
        assert_eq!(levenshtein("abc", ""), 3);
        assert_eq!(levenshtein("éa", "ea"), 1, "characters, not bytes");
    }

    #[test]
    fn first_line_and_scores() {
        assert_eq!(first_line("\n\n    return x\n    y = 2"), "    return x");
        assert_eq!(first_line("return x"), "return x");
        assert_eq!(first_line("a\r\nb"), "a");
        assert_eq!(score_line("    return x  ", "return x"), (true, 1.0));
        let (hit, sim) = score_line("return y", "return x");
        assert!(!hit);
        assert!((sim - 7.0 / 8.0).abs() < 1e-12);
        assert_eq!(score_line("", ""), (true, 1.0));
        assert_eq!(score_line("abc", ""), (false, 0.0));
    }

    #[test]
    fn bad_files_name_the_line() {
        let dir = std::env::temp_dir().join(format!("kvslim-code-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("items.jsonl");
        std::fs::write(&p, "{\"context\": \"def f():\\n\", \"answer\": \"    pass\"}\n\n{\"context\": \"x\"}\n")
            .unwrap();
        let e = load_code_items(&p).unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("answer"), "{e}");
        std::fs::write(&p, "{\"context\": \"def f():\\n\", \"answer\": \"    pass\", \"file\": \"a.py\"}\n").unwrap();
        let items = load_code_items(&p).unwrap();
        assert_eq!(items, vec![CodeItem { context: "def f():\n".into(), answer: "    pass".into() }]);
        std::fs::write(&p, "not json\n").unwrap();
        assert!(load_code_items(&p).unwrap_err().to_string().contains("line 1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
