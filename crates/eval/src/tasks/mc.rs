//! Multiple-choice tasks: `{"query", "choices", "gold"}` jsonl (PIQA, COPA,
//! ARC, BoolQ, HellaSwag as LLM Foundry ships them) and HellaSwag in
//! llama.cpp's 6-line format.

use super::read_text;
use crate::{EvalError, Result};
use serde::Deserialize;
use std::path::Path;

/// One item ready to score: choice i's full text is
/// `context + continuations[i]`; the model is scored on the continuation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McItem {
    pub context: String,
    pub continuations: Vec<String>,
    pub gold: usize,
}

impl McItem {
    /// Joins `query + delimiter + choice` and moves the whitespace at the end
    /// of `query + delimiter` to the front of every continuation (as
    /// lm-evaluation-harness does), so a tokenizer sees `" word"` at the
    /// boundary instead of a dangling space.
    pub fn from_parts(query: &str, delimiter: &str, choices: &[String], gold: usize) -> Self {
        let joined = format!("{query}{delimiter}");
        let context = joined.trim_end_matches(|c: char| c.is_whitespace());
        let moved = &joined[context.len()..];
        McItem {
            context: context.to_string(),
            continuations: choices.iter().map(|c| format!("{moved}{c}")).collect(),
            gold,
        }
    }
}

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
