//! One finished cell: its key and row, as `results.jsonl` holds them.

use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Identifies a cell of the evaluation matrix.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CellKey {
    pub model: String,
    /// Policy family (with extras), e.g. `h2o`, `h2o:agg=max`, `full`.
    pub policy: String,
    /// `20%`, `64`, or `-` when the policy ignores budgets.
    pub budget: String,
    /// [`crate::TaskSpec::label`].
    pub task: String,
    /// Perplexity cells of a quantized KV policy run in mode (a): the K/V
    /// dtype of the reference run whose eviction decisions were followed
    /// (absent: the policy decided on its own cache, mode (b)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decisions_from: Option<String>,
}

/// Non-finite metrics are written as `null` by serde_json; read them back
/// as NaN.
fn nan_map<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<BTreeMap<String, f64>, D::Error> {
    let m: BTreeMap<String, Option<f64>> = BTreeMap::deserialize(d)?;
    Ok(m.into_iter().map(|(k, v)| (k, v.unwrap_or(f64::NAN))).collect())
}

/// One finished cell.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ResultRow {
    /// The cell, its fields written first and flat, as the row's own.
    #[serde(flatten)]
    pub key: CellKey,
    /// Items evaluated (windows for perplexity).
    pub items: usize,
    #[serde(deserialize_with = "nan_map")]
    pub metrics: BTreeMap<String, f64>,
    /// Largest allocated KV bytes of one sequence in the cell.
    #[serde(default)]
    pub kv_bytes: u64,
    /// Largest metadata bytes (scores, positions) of one sequence.
    #[serde(default)]
    pub kv_metadata_bytes: u64,
    /// Seconds: `wall` for the whole cell, others per kind.
    #[serde(default, deserialize_with = "nan_map")]
    pub timings: BTreeMap<String, f64>,
    /// Per-item values behind a metric, in item order, for paired
    /// comparisons against the full cache on the same items
    /// ([`crate::paired`]): `acc` and `acc_norm` (0 or 1 per item), `nll`
    /// (per window); multiple-choice rows add `pick` and `pick_norm` (the
    /// chosen choice's index) and `gold_logprob` (the gold continuation's
    /// summed log-prob, for item-by-item comparisons with other harnesses).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_item: BTreeMap<String, Vec<f64>>,
    pub kvslim_version: String,
    pub git_commit: String,
    /// Seconds since the Unix epoch when the row was made.
    #[serde(default)]
    pub unix_time: u64,
    /// Sharded runs only: the shard (`I/N`) that ran the cell
    /// ([`crate::shard`]); merged results drop it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// Sharded runs only: the run's configuration fingerprint
    /// ([`crate::MatrixConfig::fingerprint`]); merged results drop it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

impl PartialEq for ResultRow {
    /// Equal when every field is, NaN metrics counting as equal.
    fn eq(&self, o: &Self) -> bool {
        let same = |a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>| {
            a.len() == b.len()
                && a.iter().zip(b).all(|((ka, va), (kb, vb))| ka == kb && (va == vb || (va.is_nan() && vb.is_nan())))
        };
        self.key == o.key
            && self.items == o.items
            && same(&self.metrics, &o.metrics)
            && same(&self.timings, &o.timings)
            && self.per_item == o.per_item
            && (self.kv_bytes, self.kv_metadata_bytes, self.unix_time) == (o.kv_bytes, o.kv_metadata_bytes, o.unix_time)
            && (&self.kvslim_version, &self.git_commit) == (&o.kvslim_version, &o.git_commit)
            && (&self.shard, &self.run) == (&o.shard, &o.run)
    }
}

/// The commit of the source tree, from `git rev-parse HEAD` (run once, in
/// this crate's source directory, then in the working directory), else
/// `unknown`.
pub fn git_commit() -> String {
    static COMMIT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    COMMIT
        .get_or_init(|| {
            let run = |dir: Option<&Path>| {
                let mut c = std::process::Command::new("git");
                c.args(["rev-parse", "HEAD"]).stderr(std::process::Stdio::null());
                if let Some(d) = dir {
                    c.current_dir(d);
                }
                let out = c.output().ok().filter(|o| o.status.success())?;
                let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
                (s.len() >= 7 && s.bytes().all(|b| b.is_ascii_hexdigit())).then_some(s)
            };
            let here = Path::new(env!("CARGO_MANIFEST_DIR"));
            run(here.is_dir().then_some(here)).or_else(|| run(None)).unwrap_or_else(|| "unknown".into())
        })
        .clone()
}

impl ResultRow {
    /// A row for a cell with version, commit and time filled in.
    pub fn new(model: &str, policy: &str, budget: &str, task: &str) -> Self {
        ResultRow {
            key: CellKey {
                model: model.into(),
                policy: policy.into(),
                budget: budget.into(),
                task: task.into(),
                decisions_from: None,
            },
            items: 0,
            metrics: BTreeMap::new(),
            kv_bytes: 0,
            kv_metadata_bytes: 0,
            timings: BTreeMap::new(),
            per_item: BTreeMap::new(),
            kvslim_version: env!("CARGO_PKG_VERSION").into(),
            git_commit: git_commit(),
            unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            shard: None,
            run: None,
        }
    }

    /// The policy as tables show it: the family, plus `[decisions from D]`
    /// for a mode (a) cell.
    pub fn policy_label(&self) -> String {
        match &self.key.decisions_from {
            Some(d) => format!("{} [decisions from {d}]", self.key.policy),
            None => self.key.policy.clone(),
        }
    }

    /// Sets a metric (builder style).
    pub fn metric(mut self, name: &str, value: f64) -> Self {
        self.metrics.insert(name.into(), value);
        self
    }

    /// Records a per-item metric and, as the metric of that name, its mean
    /// (0 with no items).
    pub fn per_item_mean(&mut self, name: &str, values: Vec<f64>) {
        self.metrics.insert(name.into(), values.iter().sum::<f64>() / values.len().max(1) as f64);
        self.per_item.insert(name.into(), values);
    }
}
