//! Prompts of an exact token count cut from a text file: windows of the
//! text spread over the file, each tokenized by the server (`POST
//! /tokenize`, so the ids are exactly what `/v1/completions` runs for that
//! text, BOS included when the model's tokenizer adds one) and cut to N
//! ids. The ids are sent as the prompt (`"prompt": [ids]`), so every
//! request holds exactly N prompt tokens and no round trip through text
//! can change them.
//!
//! Used by the soak (`kvslim loadtest --soak --prompt-file`) and the load
//! test (`kvslim loadtest --prompt-file`).

use crate::http_client;
use serde_json::json;

/// `count` distinct windows of `text`, each exactly `n` tokens long as
/// `tokenize` cuts them. The first starts at the beginning of the text,
/// the others are spread evenly over the rest (at word starts), the last
/// starting early enough to hold `n` tokens; windows may overlap but never
/// start at the same place. Errors name what is missing: an empty text,
/// `n` or `count` of 0, a text too short for `count` windows of `n`
/// tokens, two windows that tokenize the same.
pub fn windows(
    text: &str,
    count: usize,
    n: usize,
    tokenize: &mut dyn FnMut(&str) -> Result<Vec<u32>, String>,
) -> Result<Vec<Vec<u32>>, String> {
    if n == 0 {
        return Err("the prompt length must be at least 1 token".into());
    }
    if count == 0 {
        return Err("at least one prompt window is needed".into());
    }
    if text.trim().is_empty() {
        return Err("the text is empty".into());
    }
    let (first, span) = window_at(text, 0, n, tokenize)?;
    let mut out = vec![first];
    if count == 1 {
        return Ok(out);
    }
    // the last window starts 2 spans of the first before the end, so that
    // text of a similar density holds its n tokens
    let last_start = text.len().saturating_sub(2 * span);
    let mut prev = 0;
    for i in 1..count {
        let start = word_start(text, i * last_start / (count - 1));
        if start <= prev || start >= text.len() {
            return Err(format!(
                "too little text for {count} windows of {n} tokens (the first window spans {span} of its {} bytes)",
                text.len()
            ));
        }
        let (ids, _) = window_at(text, start, n, tokenize)?;
        if let Some(j) = out.iter().position(|w| *w == ids) {
            return Err(format!("windows {j} and {i} of the text are the same {n} tokens"));
        }
        out.push(ids);
        prev = start;
    }
    Ok(out)
}

/// The first `n` tokens of `text[start..]` and the bytes they came from
/// (the slice tokenized, grown until it holds `n` tokens).
fn window_at(
    text: &str,
    start: usize,
    n: usize,
    tokenize: &mut dyn FnMut(&str) -> Result<Vec<u32>, String>,
) -> Result<(Vec<u32>, usize), String> {
    let mut len = (8 * n).max(256);
    loop {
        let end = char_boundary(text, start.saturating_add(len));
        let ids = tokenize(&text[start..end])?;
        if ids.len() >= n {
            return Ok((ids[..n].to_vec(), end - start));
        }
        if end == text.len() {
            return Err(format!(
                "too little text for a window of {n} tokens: from byte {start} to the end there are only {}",
                ids.len()
            ));
        }
        len = len.saturating_mul(2);
    }
}

/// The first char boundary at or after `i` (the text's end past it).
fn char_boundary(text: &str, i: usize) -> usize {
    (i.min(text.len())..=text.len()).find(|&j| text.is_char_boundary(j)).unwrap_or(text.len())
}

/// The start of the first word at or after `i` (within 256 bytes; else the
/// char boundary at `i`).
fn word_start(text: &str, i: usize) -> usize {
    let i = char_boundary(text, i);
    if i == 0 || text[..i].ends_with(char::is_whitespace) {
        return i;
    }
    let rest = &text[i..];
    let limit = rest.len().min(256);
    match rest.char_indices().take_while(|&(j, _)| j < limit).find(|&(_, c)| c.is_whitespace()) {
        Some((j, c)) => {
            let after = i + j + c.len_utf8();
            let skip = text[after..].len() - text[after..].trim_start().len();
            after + skip
        }
        None => i,
    }
}

/// `POST /tokenize` on a server: the ids `/v1/completions` runs for `text`.
pub fn tokenize_on(addr: &str, headers: &[(&str, &str)], text: &str) -> Result<Vec<u32>, String> {
    let body = json!({"prompt": text}).to_string();
    let r = http_client::request_with(addr, "POST", "/tokenize", Some(&body), headers)
        .map_err(|e| format!("/tokenize: {e}"))?;
    if r.status != 200 {
        return Err(format!("/tokenize: HTTP {}: {}", r.status, r.text()));
    }
    serde_json::from_value(r.json()["tokens"].clone()).map_err(|e| format!("/tokenize: {e}: {}", r.text()))
}

/// The model's context length as the server states it (`/v1/models`).
pub fn context_on(addr: &str, headers: &[(&str, &str)]) -> Result<usize, String> {
    let r =
        http_client::request_with(addr, "GET", "/v1/models", None, headers).map_err(|e| format!("/v1/models: {e}"))?;
    if r.status != 200 {
        return Err(format!("/v1/models: HTTP {}: {}", r.status, r.text()));
    }
    r.json()["data"][0]["context_length"]
        .as_u64()
        .map(|c| c as usize)
        .ok_or_else(|| format!("no context_length in /v1/models: {}", r.text()))
}

/// Reads `path` and, once `n` is known to leave room in the server's
/// context (a prompt must leave at least one token to generate), cuts
/// `count` windows of exactly `n` tokens from it with the server's
/// tokenizer.
pub fn from_file_on(
    addr: &str,
    headers: &[(&str, &str)],
    path: &std::path::Path,
    count: usize,
    n: usize,
) -> Result<Vec<Vec<u32>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read prompt file {}: {e}", path.display()))?;
    check_fits(n, context_on(addr, headers)?)?;
    windows(&text, count, n, &mut |t| tokenize_on(addr, headers, t)).map_err(|e| format!("{}: {e}", path.display()))
}

/// A prompt of `n` tokens must leave a token of the server's context `ctx`.
pub fn check_fits(n: usize, ctx: usize) -> Result<(), String> {
    if n == 0 {
        return Err("--prompt-tokens must be at least 1".into());
    }
    if n >= ctx {
        return Err(format!(
            "--prompt-tokens {n} does not fit the server's context of {ctx} tokens (a prompt must leave at least one token to generate)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One id per whitespace-separated word (a hash of it), a "BOS" 1
    /// first, like a tokenizer that prepends one.
    fn words(t: &str) -> Result<Vec<u32>, String> {
        let mut ids = vec![1];
        ids.extend(t.split_whitespace().map(hash));
        Ok(ids)
    }

    fn hash(w: &str) -> u32 {
        w.bytes().fold(2166136261u32, |h, b| (h ^ b as u32).wrapping_mul(16777619))
    }

    fn text(words: usize) -> String {
        (0..words).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn windows_are_exact_distinct_and_spread() {
        let t = text(5000);
        let mut calls = 0;
        let w = windows(&t, 4, 300, &mut |s| {
            calls += 1;
            words(s)
        })
        .unwrap();
        assert_eq!(w.len(), 4);
        assert!(w.iter().all(|x| x.len() == 300 && x[0] == 1), "BOS kept, exact length");
        for i in 0..4 {
            for j in 0..i {
                assert_ne!(w[i], w[j], "windows {i} and {j}");
            }
        }
        // the first window is the text's start; the others start at words
        assert_eq!(w[0][1..3], [hash("w0"), hash("w1")]);
        assert!(w[1..].iter().all(|x| x[1] != hash("w0")));
        assert!(calls >= 4);
        // a non-ASCII text: offsets land on char boundaries
        let u: String = (0..3000).map(|i| format!("ñ{i}é ")).collect();
        let w = windows(&u, 3, 50, &mut words).unwrap();
        assert_eq!(w.iter().map(Vec::len).collect::<Vec<_>>(), [50, 50, 50]);
    }

    #[test]
    fn bad_inputs_are_errors_that_say_why() {
        let t = text(100);
        let e = windows(&t, 4, 0, &mut words).unwrap_err();
        assert!(e.contains("at least 1 token"), "{e}");
        let e = windows("  \n", 4, 10, &mut words).unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let e = windows(&t, 4, 500, &mut words).unwrap_err();
        assert!(e.contains("too little text"), "{e}");
        let e = windows(&t, 40, 60, &mut words).unwrap_err();
        assert!(e.contains("too little text for 40 windows"), "{e}");
        let e = windows(&"a ".repeat(3000), 2, 100, &mut words).unwrap_err();
        assert!(e.contains("the same 100 tokens"), "{e}");
        let e = windows(&t, 2, 10, &mut |_| Err("HTTP 413".to_string())).unwrap_err();
        assert_eq!(e, "HTTP 413");
        assert!(check_fits(512, 512).unwrap_err().contains("context of 512"));
        assert!(check_fits(0, 512).is_err());
        check_fits(511, 512).unwrap();
    }
}
