//! What the scheduler tells a request's handler, and the log-probs it
//! reports.

/// What the scheduler tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// Log-probs of the prompt's tokens after the first (`echo` with
    /// `logprobs`), from the request's own prefill; sent once, before any
    /// text.
    Prompt(Vec<TokenLogprob>),
    /// New text (already cut at stop strings, complete UTF-8) and, when the
    /// request asked for log-probs, the generated tokens that start in it
    /// (a token whose bytes do not complete a character yet travels with
    /// the text that completes it; the EOS that ends a request comes with
    /// the last piece, possibly with empty text).
    Text(String, Vec<TokenLogprob>),
    Done(Finish),
    /// The request failed after it was accepted.
    Error(String),
    /// The request passed its deadline ([`super::Request::deadline`]) after
    /// this many generated tokens; it was stopped and its KV freed.
    TimedOut(usize),
    /// A context was made and stored (`POST /v1/contexts`): its report.
    Context(serde_json::Value),
}

/// End of a request.
#[derive(Debug, Clone)]
pub struct Finish {
    /// `stop` (EOS or stop string) or `length` (max_tokens / context).
    pub reason: &'static str,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub kv_bytes: usize,
    /// Prompt tokens taken from the prefix cache instead of prefilled.
    pub prompt_tokens_reused: usize,
    /// K/V bytes the sequence's cache held at its end.
    pub kv_bytes_final: usize,
    /// K/V bytes a `full` f32 cache of the same tokens would hold (what the
    /// policy saved is measured against it).
    pub kv_bytes_full: usize,
}

/// One token's log-probability and the most likely alternatives at its
/// position. Log-probs are the log-softmax of the model's raw logits,
/// computed in f64 ([`kvslim_kernels::ops::log_sum_exp`], the same
/// arithmetic as `kvslim perplexity`), so sampling settings (temperature,
/// top-p) never change them, as in OpenAI's API.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f64,
    /// The `k` most likely ids and their log-probs, most likely first
    /// (equal logits: lower id first).
    pub top: Vec<(u32, f64)>,
}

/// The log-prob of `id` in one row of logits and the row's `k` most
/// likely ids (one pass for the normaliser, one for the top `k`).
pub fn token_logprob(row: &[f32], id: u32, k: usize) -> TokenLogprob {
    let lse = kvslim_kernels::ops::log_sum_exp(row);
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k > 0 {
        for (i, &v) in row.iter().enumerate() {
            // NaN never enters; ties keep the earlier (lower) id ahead
            if v.is_nan() || (top.len() == k && v <= top[k - 1].1) {
                continue;
            }
            let at = top.partition_point(|&(_, t)| t >= v);
            top.insert(at, (i as u32, v));
            top.truncate(k);
        }
    }
    TokenLogprob {
        id,
        logprob: row[id as usize] as f64 - lse,
        top: top.into_iter().map(|(i, v)| (i, v as f64 - lse)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::token_logprob;

    #[test]
    fn logprob_is_the_log_softmax_of_the_row() {
        let row = [1.0f32, 2.0, 3.0];
        let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        let lp = token_logprob(&row, 1, 0);
        assert_eq!(lp.id, 1);
        assert!((lp.logprob - (2.0 - lse)).abs() < 1e-9, "{}", lp.logprob);
        assert!(lp.top.is_empty());
    }

    #[test]
    fn top_k_most_likely_first_ties_lower_id_first() {
        let row = [0.5f32, 3.0, 1.0, 3.0, -2.0];
        let ids: Vec<u32> = token_logprob(&row, 4, 3).top.iter().map(|&(i, _)| i).collect();
        assert_eq!(ids, [1, 3, 2]);
        // more alternatives than the row has: every id, in order
        let ids: Vec<u32> = token_logprob(&row, 0, 9).top.iter().map(|&(i, _)| i).collect();
        assert_eq!(ids, [1, 3, 2, 0, 4]);
    }

    #[test]
    fn nan_never_enters_the_top() {
        let row = [f32::NAN, 1.0, 0.0];
        let top = token_logprob(&row, 1, 2).top;
        assert_eq!(top.iter().map(|&(i, _)| i).collect::<Vec<_>>(), [1, 2]);
    }
}
