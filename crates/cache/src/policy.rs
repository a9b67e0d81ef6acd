//! Cache policies and the policy-spec grammar shared by the CLI, server,
//! evaluation and config files. A policy decides *which* slot leaves;
//! [`crate::store`] decides *where* data lives.

use crate::store::HeadSlots;

/// What the forward pass tells a policy, and what it lets a policy do.
pub trait CachePolicy: Send {
    /// Short name for reports (`full`, `h2o`, …).
    fn name(&self) -> &str;

    /// Slots to allocate per (layer, KV head) for a sequence of at most
    /// `max_len` tokens. Budgeted policies return budget + 1 (one candidate).
    fn capacity(&self, max_len: usize) -> usize;

    /// True when the policy needs attention probabilities after each step;
    /// lets the forward pass skip handing them over otherwise.
    fn observes_attention(&self) -> bool {
        false
    }

    /// Called once per decode step, per layer and KV head, after attention
    /// over the candidate set. `probs` is `group × slots.len()`, row h being
    /// query head h of this KV head's group, slot-aligned.
    fn after_decode_step(&mut self, _layer: usize, _kv_head: usize, _slots: &mut HeadSlots, _probs: &[f32]) {}
}

/// The `full` policy: keep everything.
pub struct FullCache;

impl CachePolicy for FullCache {
    fn name(&self) -> &str {
        "full"
    }
    fn capacity(&self, max_len: usize) -> usize {
        max_len
    }
}

/// A parsed policy specification, e.g. `full`.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicySpec {
    Full,
}

/// A policy string that could not be parsed; the message names the problem.
#[derive(Debug, thiserror::Error)]
#[error("invalid policy spec '{spec}': {reason}")]
pub struct PolicySpecError {
    pub spec: String,
    pub reason: String,
}

impl PolicySpec {
    /// Parses the policy grammar (see README "Policies").
    pub fn parse(spec: &str) -> Result<Self, PolicySpecError> {
        let err = |reason: String| PolicySpecError { spec: spec.to_string(), reason };
        let trimmed = spec.trim();
        let (name, args) = trimmed.split_once(':').unwrap_or((trimmed, ""));
        match name {
            "full" if args.is_empty() => Ok(PolicySpec::Full),
            "full" => Err(err("`full` takes no parameters".into())),
            "" => Err(err("empty policy name; known policies: full".into())),
            other => Err(err(format!("unknown policy `{other}`; known policies: full"))),
        }
    }

    /// Instantiates the policy state for one sequence.
    pub fn build(&self) -> Box<dyn CachePolicy> {
        match self {
            PolicySpec::Full => Box::new(FullCache),
        }
    }
}

impl std::str::FromStr for PolicySpec {
    type Err = PolicySpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicySpec::parse(s)
    }
}

impl std::fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicySpec::Full => f.write_str("full"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_and_rejects_garbage() {
        assert_eq!(PolicySpec::parse("full").unwrap(), PolicySpec::Full);
        assert_eq!(PolicySpec::parse(" full ").unwrap().to_string(), "full");
        let e = PolicySpec::parse("fancy:x=1").unwrap_err().to_string();
        assert!(e.contains("unknown policy `fancy`"), "{e}");
        assert!(PolicySpec::parse("full:x=1").is_err());
        assert!(PolicySpec::parse("").is_err());
    }
}
