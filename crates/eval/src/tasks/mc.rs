//! Multiple-choice tasks: `{"query", "choices", "gold"}` jsonl (PIQA, COPA,
//! ARC, BoolQ, HellaSwag as LLM Foundry ships them) and HellaSwag in
//! llama.cpp's 6-line format; both kinds score a cell the same way
//! ([`Choices`]).

use super::kind::{file_spec, set_option, single, Kind, KvPeak, Prepared, Task};
use super::read_text;
use crate::cell::{block_size, Cell};
use crate::error::{EvalError, Result};
use crate::forked::score_items;
pub use crate::score::McItem;
use crate::score::{encode_item, predict, predict_norm, score_choices, Choice, McTally, Scoring};
use kvslim_models::{Model, Tokenizer};
use rayon::prelude::*;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The text between query and choice when none is given, chosen from the
/// query so each file in `../shared/data` reads naturally:
///
/// * a query starting with `Question:` or `Passage:` (PIQA, ARC, BoolQ) is
///   answered after `Answer: ` — on a new line unless the query already
///   ends with one;
/// * anything else (COPA, HellaSwag) continues after one space.
pub fn default_delimiter(query: &str) -> &'static str {
    if query.starts_with("Question:") || query.starts_with("Passage:") {
        if query.ends_with('\n') {
            "Answer: "
        } else {
            "\nAnswer: "
        }
    } else {
        " "
    }
}

#[derive(Deserialize)]
struct RawItem {
    query: String,
    choices: Vec<String>,
    gold: usize,
}

/// Parses multiple-choice jsonl text (blank lines are skipped); `path` only
/// names the source in errors.
pub fn parse_mc_jsonl(path: &Path, text: &str, delimiter: Option<&str>) -> Result<Vec<McItem>> {
    let mut items = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let err = |reason: String| EvalError::parse(path, i + 1, reason);
        let raw: RawItem = serde_json::from_str(line)
            .map_err(|e| err(format!("expected {{\"query\": str, \"choices\": [str], \"gold\": int}}: {e}")))?;
        if raw.choices.len() < 2 {
            return Err(err(format!("needs at least 2 choices, found {}", raw.choices.len())));
        }
        if raw.gold >= raw.choices.len() {
            return Err(err(format!("`gold` is {} but there are only {} choices", raw.gold, raw.choices.len())));
        }
        let delim = delimiter.unwrap_or_else(|| default_delimiter(&raw.query));
        items.push(McItem::from_parts(&raw.query, delim, &raw.choices, raw.gold));
    }
    if items.is_empty() {
        return Err(EvalError::File { path: path.into(), reason: "no items".into() });
    }
    Ok(items)
}

/// Loads a multiple-choice jsonl file (optionally `.bz2`).
pub fn load_mc_jsonl(path: &Path, delimiter: Option<&str>) -> Result<Vec<McItem>> {
    parse_mc_jsonl(path, &read_text(path)?, delimiter)
}

/// Parses HellaSwag in llama.cpp's format: per item six lines: the context,
/// the gold index 0-3, then the four endings. Choice i is scored as
/// `context + " " + ending_i`.
pub fn parse_hellaswag(path: &Path, text: &str) -> Result<Vec<McItem>> {
    let lines: Vec<&str> = text.lines().collect();
    // a trailing blank line is not an item
    let n = lines.iter().rposition(|l| !l.trim().is_empty()).map_or(0, |i| i + 1);
    if n == 0 {
        return Err(EvalError::File { path: path.into(), reason: "no items".into() });
    }
    if n % 6 != 0 {
        let start = n / 6 * 6;
        return Err(EvalError::parse(
            path,
            start + 1,
            format!("incomplete item: {} of its 6 lines (context, gold index, 4 endings) before the end", n - start),
        ));
    }
    let mut items = Vec::with_capacity(n / 6);
    for (k, chunk) in lines[..n].chunks_exact(6).enumerate() {
        let at = k * 6;
        let context = chunk[0].trim_end_matches('\r');
        if context.trim().is_empty() {
            return Err(EvalError::parse(path, at + 1, "empty context line"));
        }
        let g = chunk[1].trim();
        let gold = match g.parse::<usize>() {
            Ok(v) if v < 4 => v,
            _ => {
                return Err(EvalError::parse(
                    path,
                    at + 2,
                    format!("expected the gold ending index 0-3, found `{}`", truncate(g, 40)),
                ))
            }
        };
        let endings: Vec<String> = chunk[2..].iter().map(|e| e.trim_end_matches('\r').to_string()).collect();
        items.push(McItem::from_parts(context, " ", &endings, gold));
    }
    Ok(items)
}

/// Loads HellaSwag's 6-line format, plain or `.bz2`.
pub fn load_hellaswag(path: &Path) -> Result<Vec<McItem>> {
    parse_hellaswag(path, &read_text(path)?)
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

pub const MC: Kind = Kind {
    names: &["mc"],
    file: true,
    extensions: &[".jsonl"],
    options: "delim, limit",
    headline: &["acc", "acc_norm"],
    new: |_, path| Box::new(Mc { path, delimiter: None }),
};

/// Multiple choice from HellaSwag's own file format: [`MC`]'s metrics.
pub const HELLASWAG: Kind = Kind {
    names: &["hellaswag"],
    extensions: &[".bz2"],
    options: "limit",
    new: |_, path| Box::new(HellaSwag { path }),
    ..MC
};

/// `mc:FILE[,delim=TEXT]`: `{"query","choices","gold"}` jsonl.
#[derive(Clone, Debug, PartialEq)]
pub struct Mc {
    pub path: PathBuf,
    pub delimiter: Option<String>,
}

/// `hellaswag:FILE`: llama.cpp's 6-line HellaSwag, plain or `.bz2`.
#[derive(Clone, Debug, PartialEq)]
pub struct HellaSwag {
    pub path: PathBuf,
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

impl Task for Mc {
    fn name(&self) -> &'static str {
        "mc"
    }

    fn set(&mut self, key: &str, vals: &[&str]) -> Result<bool, String> {
        set_option(&mut self.delimiter, key, "delim", vals, |k, v| Ok(Some(unescape(single(k, v)?))))
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn render(&self, short: bool) -> String {
        file_spec("mc", &self.path, short, &[self.delimiter.as_ref().map(|d| format!("delim={}", escape(d)))])
    }

    fn prepare(&self, _: &Model, tok: &Tokenizer, limit: Option<usize>) -> Result<Box<dyn Prepared>> {
        Choices::encode(load_mc_jsonl(&self.path, self.delimiter.as_deref())?, tok, limit)
    }
}

impl Task for HellaSwag {
    fn name(&self) -> &'static str {
        "hellaswag"
    }

    fn set(&mut self, _: &str, _: &[&str]) -> Result<bool, String> {
        Ok(false)
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn render(&self, short: bool) -> String {
        file_spec("hellaswag", &self.path, short, &[])
    }

    fn prepare(&self, _: &Model, tok: &Tokenizer, limit: Option<usize>) -> Result<Box<dyn Prepared>> {
        Choices::encode(load_hellaswag(&self.path)?, tok, limit)
    }
}

/// Multiple-choice items scored together by [`score_items`]: their decode
/// steps share one batch (weights read once per step for all their forks).
const FORKED_BLOCK: usize = 16;

/// Each item's context ids, choices and gold index.
struct Choices(Vec<(Vec<u32>, Vec<Choice>, usize)>);

impl Choices {
    fn encode(mut items: Vec<McItem>, tok: &Tokenizer, limit: Option<usize>) -> Result<Box<dyn Prepared>> {
        items.truncate(limit.unwrap_or(usize::MAX));
        let items = items
            .par_iter()
            .map(|it| encode_item(tok, it).map(|(c, ch)| (c, ch, it.gold)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(Choices(items)))
    }
}

impl Prepared for Choices {
    fn items(&self) -> usize {
        self.0.len()
    }

    fn journaled(&self) -> bool {
        true
    }

    /// `acc`, `acc_norm` (log-likelihood per character), `acc_stderr`,
    /// `gold_logprob` (mean), and per item the chosen answer (`pick`,
    /// `pick_norm`: 0-based choice index, so a shift of bias can be told
    /// from a loss of skill); in the configured [`crate::ScoreMode`], by
    /// default forked ([`score_items`]: the context once, each choice on a
    /// fork of its cache, [`FORKED_BLOCK`] items batched; percentage
    /// budgets against context + the item's longest choice), or per choice
    /// ([`score_choices`], [`Scoring::PerChoice`]: percentage budgets
    /// against each choice's whole sequence). Each finished block of items
    /// goes to the cell's journal, and a resumed run continues from there.
    fn run(&mut self, cell: &mut Cell<'_>) -> Result<KvPeak> {
        let (model, policy, options, items) = (cell.model, cell.policy, cell.options, &self.0);
        let mut peak = KvPeak::default();
        // blocks of items: forked blocks share their batched decode steps,
        // per-choice blocks run their items in parallel
        let block = match options.scoring {
            Scoring::Forked => FORKED_BLOCK,
            Scoring::PerChoice => block_size(),
        };
        let mut scored = std::mem::take(&mut cell.resumed.scores);
        if !scored.is_empty() {
            (cell.report)(scored.len(), items.len());
        }
        while scored.len() < items.len() {
            let block_start = Instant::now();
            let part = &items[scored.len()..(scored.len() + block).min(items.len())];
            let scores = match options.scoring {
                Scoring::PerChoice => part
                    .par_iter()
                    .map(|(c, ch, _)| score_choices(model, policy, c, ch, options.mode))
                    .collect::<Result<Vec<_>>>()?,
                Scoring::Forked => {
                    let views: Vec<(&[u32], &[Choice])> = part.iter().map(|(c, ch, _)| (&c[..], &ch[..])).collect();
                    score_items(model, policy, &views, options.mode)?
                }
            };
            if let Some(p) = cell.partial.as_deref_mut() {
                p.append(scored.len(), &scores, block_start.elapsed().as_secs_f64())?;
            }
            scored.extend(scores);
            (cell.report)(scored.len(), items.len());
        }
        let mut t = McTally::default();
        let n = items.len();
        let (mut acc, mut acc_norm) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut pick, mut pick_norm) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut gold = Vec::with_capacity(n);
        for (s, it) in scored.iter().zip(items.iter()) {
            let (a, b) = t.add(it.2, s);
            acc.push(f64::from(u8::from(a)));
            acc_norm.push(f64::from(u8::from(b)));
            pick.push(predict(s) as f64);
            pick_norm.push(predict_norm(s) as f64);
            gold.push(s[it.2].logprob_sum);
            for c in s {
                peak.see(c.kv_bytes, c.kv_metadata_bytes);
            }
        }
        let row = &mut *cell.row;
        row.metrics.insert("acc".into(), t.acc());
        row.metrics.insert("acc_norm".into(), t.acc_norm());
        row.metrics.insert("acc_stderr".into(), t.acc_stderr());
        row.metrics.insert("gold_logprob".into(), t.gold_logprob / t.items.max(1) as f64);
        row.per_item.insert("acc".into(), acc);
        row.per_item.insert("acc_norm".into(), acc_norm);
        row.per_item.insert("pick".into(), pick);
        row.per_item.insert("pick_norm".into(), pick_norm);
        row.per_item.insert("gold_logprob".into(), gold);
        Ok(peak)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_moves_to_the_continuation() {
        let it = McItem::from_parts("Question: why?\n", "Answer: ", &["because".into(), "no".into()], 1);
        assert_eq!(it.context, "Question: why?\nAnswer:");
        assert_eq!(it.continuations, [" because", " no"]);
        let it = McItem::from_parts("The man turned on the faucet, therefore", " ", &["water flowed.".into()], 0);
        assert_eq!(it.context, "The man turned on the faucet, therefore");
        assert_eq!(it.continuations, [" water flowed."]);
        assert_eq!(default_delimiter("Question: x"), "\nAnswer: ");
        assert_eq!(default_delimiter("Passage: x\nQuestion: y?"), "\nAnswer: ");
        assert_eq!(default_delimiter("Question: x\n"), "Answer: ");
        assert_eq!(default_delimiter("The cat"), " ");
    }

    #[test]
    fn jsonl_errors_name_file_and_line() {
        let p = Path::new("t.jsonl");
        let good = r#"{"query": "q", "choices": ["a", "b"], "gold": 1}"#;
        let items = parse_mc_jsonl(p, &format!("{good}\n\n{good}\n"), None).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].gold, 1);
        let cases = [
            (format!("{good}\n{{\"query\": \"q\", \"choices\": [\"a\"], \"gold\": 0}}"), "t.jsonl:2: needs at least 2"),
            (
                format!("{good}\n{good}\n{{\"query\": \"q\", \"choices\": [\"a\", \"b\"], \"gold\": 2}}"),
                "t.jsonl:3: `gold` is 2",
            ),
            ("{\"query\": \"q\", \"choices\": [\"a\", \"b\"]}".to_string(), "t.jsonl:1: expected"),
            ("not json".to_string(), "t.jsonl:1:"),
            ("\n\n".to_string(), "no items"),
        ];
        for (text, want) in cases {
            let e = parse_mc_jsonl(p, &text, None).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn hellaswag_six_line_format() {
        let p = Path::new("hs.txt");
        let text = "A man sits. he\r\n2\r\nstands.\r\nruns.\r\njumps.\r\nsleeps.\r\nCtx two\n0\na\nb\nc\nd\n\n";
        let items = parse_hellaswag(p, text).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].context, "A man sits. he");
        assert_eq!(items[0].continuations[2], " jumps.");
        assert_eq!(items[0].gold, 2);
        let e = parse_hellaswag(p, "c\n7\na\nb\nc\nd\n").unwrap_err().to_string();
        assert!(e.contains("hs.txt:2: expected the gold ending index 0-3, found `7`"), "{e}");
        let e = parse_hellaswag(p, "c\n1\na\nb\nc\nd\nc2\n1\na\n").unwrap_err().to_string();
        assert!(e.contains("hs.txt:7: incomplete item: 3 of its 6 lines"), "{e}");
    }
}
