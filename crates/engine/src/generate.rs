//! Autoregressive generation: prefill the prompt in one chunk, then one
//! decode step per token until EOS or the token limit; and the same for
//! several policies at once over one shared prefill ([`generate_shared`]).

pub use crate::generation::{Generation, StopReason};
use crate::lockstep::{self, Lockstep};
use crate::sampling::SamplingParams;
use crate::session::Session;
use crate::{EngineError, Result};
use kvslim_cache::{PolicySpec, PrefillKernel};
use kvslim_models::{Logits, Model};
use std::time::Instant;

/// What to generate and how.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub policy: PolicySpec,
    /// Token ids that end generation (not included in the output).
    pub eos: Vec<u32>,
}

/// Checks the prompt against the context and opens its session; returns
/// the session and how many new tokens may follow (a bounded cache may
/// continue past the trained context on RoPE models). Shared by plain,
/// beam and speculative generation.
pub(crate) fn start_session<'m>(
    model: &'m Model,
    prompt: &[u32],
    policy: &PolicySpec,
    max_tokens: usize,
) -> Result<(Session<'m>, usize)> {
    if prompt.is_empty() {
        return Err(EngineError::Request("the prompt is empty (and the tokenizer adds no BOS)".into()));
    }
    check_fits(model, prompt.len(), "prompt")?;
    let session = Session::new(model, policy, prompt.len() + max_tokens, prompt.len())?;
    let max_new = new_token_limit(&session, max_tokens);
    Ok((session, max_new))
}

/// Fails when `n` tokens of `what` (a prompt, a context) leave no room in
/// the model's context.
pub(crate) fn check_fits(model: &Model, n: usize, what: &str) -> Result<()> {
    let ctx = model.config.context_len;
    if n >= ctx {
        return Err(EngineError::Request(format!(
            "the {what} has {n} tokens but the model's context is {ctx}; shorten it"
        )));
    }
    Ok(())
}

/// How many of `max_tokens` may follow the session's tokens: all of them
/// under a bounded cache on a RoPE model (kept keys keep their positions),
/// else as many as the model's context still holds.
fn new_token_limit(session: &Session<'_>, max_tokens: usize) -> usize {
    new_token_limit_at(session, session.position(), max_tokens)
}

/// [`new_token_limit`] once the session holds `at` tokens.
pub(crate) fn new_token_limit_at(session: &Session<'_>, at: usize, max_tokens: usize) -> usize {
    let c = &session.model.config;
    if session.cache.policy().bounded() && c.learned_positions.is_none() {
        max_tokens
    } else {
        max_tokens.min(c.context_len.saturating_sub(at))
    }
}

/// Generates from `prompt`; `on_token` sees each new id as it is produced
/// and returns `false` to stop early.
pub fn generate(
    model: &Model,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Generation> {
    let mut gens = generate_shared(model, prompt, std::slice::from_ref(opts), |_, t| on_token(t))?;
    Ok(gens.pop().expect("one generation per option"))
}

/// Generates from one prompt under each of `opts` (the kvpress protocol
/// for policies that compress the prompt once): options whose caches can
/// share a prefill ([`kvslim_cache::SequenceCache::shared_prefill_kernel`])
/// run the prompt's matrix products once, each policy scoring and
/// choosing on its own ([`Model::forward_shared`]); the rest prefill
/// alone. Then they decode in lockstep, one token each per step, the
/// weights read once per step for all ([`Model::forward_batch_exact`]).
/// Every generation is bit-identical to [`generate`] with its options;
/// its `time_to_first_token_s` is the shared prefill's, its `decode_s` the
/// lockstep's time until it stopped. `on_token(i, id)` sees option `i`'s
/// ids and returns `false` to stop that one early.
pub fn generate_shared(
    model: &Model,
    prompt: &[u32],
    opts: &[GenerateOptions],
    on_token: impl FnMut(usize, u32) -> bool,
) -> Result<Vec<Generation>> {
    let mut runs = Vec::with_capacity(opts.len());
    for o in opts {
        o.sampling.validate().map_err(EngineError::Request)?;
        runs.push(start_session(model, prompt, &o.policy, o.max_tokens)?);
    }
    let mut sessions: Vec<&mut Session<'_>> = runs.iter_mut().map(|r| &mut r.0).collect();
    let first = prefill_shared(model, prompt, &mut sessions)?;
    let mut steps: Vec<Lockstep<'_, '_>> = runs
        .iter_mut()
        .zip(first)
        .zip(opts)
        .map(|(((session, max_new), (logits, prefill_s)), o)| {
            Lockstep::after_logits(session, o.sampling.clone(), o.eos.clone(), &logits, (*max_new, prefill_s))
        })
        .collect();
    lockstep::run(&mut steps, on_token)?;
    Ok(steps.into_iter().map(|r| r.into_generation(prompt.len())).collect())
}

/// Feeds `prompt` to every one of `sessions` (fresh), sharing prefills
/// where the caches can ([`Model::forward_shared`], groups from
/// [`share_groups`]; the rest alone). Returns each session's last logits
/// and the seconds its group's prefill took. Every session ends as its
/// own `feed(prompt)` would leave it, bit for bit.
pub fn prefill_shared(
    model: &Model,
    prompt: &[u32],
    sessions: &mut [&mut Session<'_>],
) -> Result<Vec<(Vec<f32>, f64)>> {
    let kernels: Vec<Option<PrefillKernel>> = sessions.iter().map(|s| s.cache.shared_prefill_kernel()).collect();
    let groups = match prompt.len() > 1 {
        true => share_groups(&kernels, |lead, member| model.shares_prefill(lead, member)),
        false => (0..sessions.len()).map(|i| vec![i]).collect(),
    };
    let mut first: Vec<Option<(Vec<f32>, f64)>> = vec![None; sessions.len()];
    for members in groups {
        let start = Instant::now();
        let logits = if members.len() == 1 {
            sessions[members[0]].feed(prompt, Logits::Last)?.to_vec()
        } else {
            // the lead first (the run is its kernel's), the rest in order
            let mut group: Vec<(usize, &mut Session<'_>)> = sessions
                .iter_mut()
                .enumerate()
                .filter(|(j, _)| members.contains(j))
                .map(|(j, s)| (j, &mut **s))
                .collect();
            group.sort_by_key(|(j, _)| *j != members[0]);
            let ((_, lead), rest) = group.split_first_mut().expect("two or more members");
            let mut others: Vec<&mut kvslim_cache::SequenceCache> =
                rest.iter_mut().map(|(_, s)| &mut s.cache).collect();
            model.forward_shared(prompt, &mut lead.cache, &mut others, &mut lead.scratch, Logits::Last)?;
            lead.scratch.logits().to_vec()
        };
        let took = start.elapsed().as_secs_f64();
        for &j in &members {
            first[j] = Some((logits.clone(), took));
        }
    }
    Ok(first.into_iter().map(|f| f.expect("every session prefilled")).collect())
}

/// The groups of one prompt's shared prefills, given each session's
/// prefill kernel (`None`: cannot share) and whether a member's kernel can
/// join a lead's ([`Model::shares_prefill`]): each group's first index is
/// its lead, whose kernel the run is. A KVzip lead takes every tiled
/// session it can (their prefill then costs nothing but their scoring);
/// the rest group by kernel in order; a session that shares with nobody
/// is a group of its own.
pub fn share_groups(
    kernels: &[Option<PrefillKernel>],
    joins: impl Fn(PrefillKernel, PrefillKernel) -> bool,
) -> Vec<Vec<usize>> {
    let mut taken = vec![false; kernels.len()];
    let mut groups = Vec::new();
    let repeat_first = kernels.iter().enumerate().filter(|(_, k)| matches!(k, Some(PrefillKernel::Repeat { .. })));
    let leads: Vec<usize> = repeat_first.map(|(i, _)| i).chain(0..kernels.len()).collect();
    for lead in leads {
        if taken[lead] {
            continue;
        }
        let Some(k) = kernels[lead] else {
            taken[lead] = true;
            groups.push(vec![lead]);
            continue;
        };
        let mut members = vec![lead];
        taken[lead] = true;
        for j in 0..kernels.len() {
            if !taken[j] && kernels[j].is_some_and(|m| joins(k, m)) {
                taken[j] = true;
                members.push(j);
            }
        }
        groups.push(members);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::share_groups;
    use kvslim_cache::PrefillKernel::{self, EveryQuery, Repeat, Tiled};

    fn groups(kernels: &[Option<PrefillKernel>], mixed: bool) -> Vec<Vec<usize>> {
        share_groups(kernels, |lead, member| {
            lead == member || (mixed && matches!(lead, Repeat { .. }) && member == Tiled)
        })
    }

    #[test]
    fn sessions_group_by_kernel_with_the_first_as_lead() {
        let k = [Some(Tiled), Some(EveryQuery), None, Some(Tiled), Some(EveryQuery)];
        assert_eq!(groups(&k, true), vec![vec![0, 3], vec![1, 4], vec![2]]);
    }

    #[test]
    fn a_kvzip_lead_takes_the_tiled_sessions_where_they_can_join_it() {
        let k = [Some(Tiled), Some(Repeat { chunk: 32 }), Some(Tiled), Some(EveryQuery), Some(Repeat { chunk: 32 })];
        assert_eq!(groups(&k, true), vec![vec![1, 0, 2, 4], vec![3]]);
        assert_eq!(groups(&k, false), vec![vec![1, 4], vec![0, 2], vec![3]]);
        // another probe's pieces: a run of its own, without the tiled ones
        let k = [Some(Repeat { chunk: 32 }), Some(Tiled), Some(Repeat { chunk: 64 })];
        assert_eq!(groups(&k, true), vec![vec![0, 1], vec![2]]);
    }
}
