//! Tune and evaluation windows cut from a text, and the check that keeps
//! them apart.

use crate::error::{EvalError, Result, Setting};
use crate::tasks::{load_ppl_text, token_windows};
use kvslim_engine::calibrate::{second_half_start, text_tokens};
use kvslim_models::Tokenizer;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Windows cut from a text's tokens, and where they came from.
#[derive(Clone, Debug, Serialize)]
pub struct TextWindows {
    pub path: PathBuf,
    pub seq_len: usize,
    /// The body tokens (BOS stripped) the windows cover: `[start, end)`.
    pub token_range: (usize, usize),
    /// Body tokens in the whole text.
    pub text_tokens: usize,
    /// SHA-256 of the windows' token ids (u32 little-endian, in order).
    pub windows_sha256: String,
    #[serde(skip)]
    pub windows: Vec<Vec<u32>>,
}

/// The text's body tokens (whole text, BOS stripped) and its BOS.
fn body_tokens(path: &Path, tok: &Tokenizer) -> Result<(Vec<u32>, Option<u32>)> {
    let text = load_ppl_text(path)?;
    let bos = tok.prepended_bos();
    Ok((text_tokens(&tok.encode(&text.text)?, bos).to_vec(), bos))
}

fn hash_windows(windows: &[Vec<u32>]) -> String {
    let mut h = Sha256::new();
    for w in windows {
        for id in w {
            h.update(id.to_le_bytes());
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// `n` consecutive windows of `seq_len` tokens, the BOS included (as
/// evaluation's `ppl:` task cuts them, and as `kvslim calibrate`'s
/// [`kvslim_engine::calibrate::calibration_windows`] counts them, which
/// spreads its windows over the text instead), from the body tokens of
/// `path` starting at `skip` (`None`: the start of the second half).
/// Errors when the text is too short.
pub fn tune_windows(
    path: &Path,
    tok: &Tokenizer,
    seq_len: usize,
    skip: Option<usize>,
    n: usize,
) -> Result<TextWindows> {
    let (body, bos) = body_tokens(path, tok)?;
    let skip = skip.unwrap_or(second_half_start(body.len()));
    cut(path, &body, bos, seq_len, skip, n)
}

/// The first `n` windows of `path`, as `ppl:FILE,seq_len=L,limit=n` takes
/// them: what a held-out evaluation reads.
pub fn evaluation_windows(path: &Path, tok: &Tokenizer, seq_len: usize, n: usize) -> Result<TextWindows> {
    let (body, bos) = body_tokens(path, tok)?;
    cut(path, &body, bos, seq_len, 0, n)
}

pub(super) fn cut(
    path: &Path,
    body: &[u32],
    bos: Option<u32>,
    seq_len: usize,
    skip: usize,
    n: usize,
) -> Result<TextWindows> {
    if seq_len < 2 || n == 0 {
        return Err(EvalError::Request("tune: windows need seq_len ≥ 2 and a count ≥ 1".into()));
    }
    let per = seq_len - usize::from(bos.is_some());
    let need = per * n;
    if skip.saturating_add(need) > body.len() {
        return Err(EvalError::File {
            path: path.into(),
            reason: format!(
                "{n} windows of {seq_len} tokens from token {skip} need {need} tokens, but the text has {} after it",
                body.len().saturating_sub(skip)
            ),
        });
    }
    let windows = token_windows(&body[skip..skip + need], seq_len, bos, Some(n));
    Ok(TextWindows {
        path: path.into(),
        seq_len,
        token_range: (skip, skip + need),
        text_tokens: body.len(),
        windows_sha256: hash_windows(&windows),
        windows,
    })
}

/// Refuses an evaluation that would read tokens tuning read: the same file
/// (by canonical path) with overlapping token ranges.
pub fn check_disjoint(tune: &TextWindows, eval: &TextWindows) -> Result<()> {
    let same = match (tune.path.canonicalize(), eval.path.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => tune.path == eval.path,
    };
    let (t, e): (Range<usize>, Range<usize>) =
        (tune.token_range.0..tune.token_range.1, eval.token_range.0..eval.token_range.1);
    if same && t.start < e.end && e.start < t.end {
        let before = format!(
            "the evaluation text {} is the calibration text, and its evaluation windows (tokens {}..{}) overlap the tune windows (tokens {}..{}): \
             tuning must never read evaluation text; move the tune windows past them (",
            eval.path.display(),
            e.start,
            e.end,
            t.start,
            t.end,
        );
        return Err(EvalError::setting(Setting::SkipTokens, Some(e.end as u64), before, ") or evaluate fewer windows"));
    }
    Ok(())
}
