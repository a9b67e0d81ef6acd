//! Per-request CHAI state: which query head uses whose scores in each
//! layer, which KV heads still store K, and which KV heads must keep
//! identical slot sets (so a member can apply its representative's
//! probabilities to its own V).
//!
//! Dense layers are described the same way (every head its own
//! representative), so the forward pass has one code path.

use super::online::{cluster_by_kv_groups, cluster_heads, probe_feature_len, HeadClusters};
use super::plan::{ChaiPlan, PlanError};
use super::{cosine_distances, RepRule};
use crate::store::KvStore;
use std::sync::Arc;

/// `chai:plan=FILE[,probe=N][,rep=first|medoid]` or `chai-static:plan=FILE`.
#[derive(Clone, Debug)]
pub struct HeadSharingSpec {
    pub plan_path: String,
    /// The plan once [`HeadSharingSpec::load_plan`] has read `plan_path`.
    /// `None` as parsed: parsing a policy string never touches the file
    /// system, so a spec can be checked, printed and passed around before
    /// (or without) the plan existing.
    pub plan: Option<Arc<ChaiPlan>>,
    /// Tokens run dense before clustering (online CHAI).
    pub probe: usize,
    pub rep: RepRule,
    /// `chai-static`: membership fixed from the plan, no probe.
    pub fixed: bool,
    /// `drift=T[:D]`: re-cluster when attention drifts from the probe.
    pub drift: Option<Drift>,
}

/// Drift checks (`drift=T[:D]`): every `every` tokens after clustering a
/// re-probe of `probe` decode steps runs every head on its own keys, and a
/// layer where some member's attention rows (concatenated over the
/// re-probe) lie farther than `threshold` (cosine distance) from its
/// representative's is re-clustered from those rows. Members may become
/// representatives, so every KV head keeps its K: drift checks trade CHAI's
/// K saving for its quality (README "CHAI": measured, not a reliable gain).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Drift {
    pub every: usize,
    pub threshold: f64,
}

impl Drift {
    /// Cosine distance above which a layer is re-clustered, when `drift=T`
    /// gives none (the best of 0.3/0.6/0.9 on SmolLM2: lower thresholds
    /// re-cluster often and measured worse).
    pub const DEFAULT_THRESHOLD: f64 = 0.9;
}

impl HeadSharingSpec {
    /// Reads and self-checks the plan file, once (a loaded spec is left as
    /// it is, so clones share one plan). The error names the file.
    pub fn load_plan(&mut self) -> Result<(), PlanError> {
        if self.plan.is_none() {
            self.plan = Some(Arc::new(ChaiPlan::load(std::path::Path::new(&self.plan_path))?));
        }
        Ok(())
    }

    /// The loaded plan; an error naming the file when nobody loaded it
    /// (a spec straight from the parser reached a cache).
    pub fn plan(&self) -> Result<&Arc<ChaiPlan>, String> {
        self.plan.as_ref().ok_or_else(|| {
            format!("CHAI plan {} was not loaded (call PolicySpec::load_plans after parsing)", self.plan_path)
        })
    }
}

impl PartialEq for HeadSharingSpec {
    fn eq(&self, o: &Self) -> bool {
        self.plan_path == o.plan_path
            && self.probe == o.probe
            && self.rep == o.rep
            && self.fixed == o.fixed
            && self.drift == o.drift
    }
}

/// KV heads whose slot sets must stay identical, and the representatives
/// whose probabilities drive their scores and evictions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Component {
    /// Ascending KV head indices.
    pub kv_heads: Vec<usize>,
    /// The KV head whose slot metadata the token policy reads and updates.
    pub leader: usize,
    /// Representatives (query heads) whose keys live in this component.
    pub reps: Vec<usize>,
}

/// One layer's head structure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerHeads {
    /// Per query head: the head whose q·k scores it uses.
    pub representative_of: Vec<usize>,
    /// Representatives, ascending.
    pub reps: Vec<usize>,
    pub components: Vec<Component>,
    /// Canonical clusters (reporting).
    pub clusters: Vec<Vec<usize>>,
}

impl LayerHeads {
    /// Every query head its own representative; every KV head its own component.
    pub fn dense(n_heads: usize, n_kv_heads: usize) -> Self {
        Self::from_clusters(&HeadClusters::singletons(n_heads), n_kv_heads)
    }

    /// Components are the connected KV heads: a member's KV head is tied to
    /// its representative's (the member reads probabilities over the
    /// representative's slots with its own V).
    pub fn from_clusters(hc: &HeadClusters, n_kv_heads: usize) -> Self {
        let n_heads = hc.n_heads();
        let g = n_heads / n_kv_heads;
        let mut parent: Vec<usize> = (0..n_kv_heads).collect();
        fn find(p: &mut [usize], x: usize) -> usize {
            let mut r = x;
            while p[r] != r {
                r = p[r];
            }
            p[x] = r;
            r
        }
        for h in 0..n_heads {
            let (a, b) = (find(&mut parent, h / g), find(&mut parent, hc.representative_of[h] / g));
            if a != b {
                parent[a.max(b)] = a.min(b);
            }
        }
        let mut reps: Vec<usize> = hc.representatives.clone();
        reps.sort_unstable();
        let mut components: Vec<Component> = Vec::new();
        for kv in 0..n_kv_heads {
            let root = find(&mut parent, kv);
            match components.iter_mut().find(|c| c.kv_heads[0] == root) {
                Some(c) => c.kv_heads.push(kv),
                None => components.push(Component { kv_heads: vec![kv], leader: kv, reps: Vec::new() }),
            }
        }
        for c in &mut components {
            c.reps = reps.iter().copied().filter(|&r| c.kv_heads.contains(&(r / g))).collect();
            // the leader must hold keys: the KV head of the component's first representative
            c.leader = c.reps.first().map_or(c.kv_heads[0], |&r| r / g);
        }
        LayerHeads { representative_of: hc.representative_of.clone(), reps, components, clusters: hc.clusters.clone() }
    }

    /// KV heads some representative reads K from.
    pub fn kv_heads_with_keys(&self, group: usize) -> Vec<bool> {
        let n_kv = self.representative_of.len() / group;
        let mut used = vec![false; n_kv];
        for &r in &self.reps {
            used[r / group] = true;
        }
        used
    }
}

/// What `perplexity --json` reports per layer for CHAI policies.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LayerClustersReport {
    pub clusters: Vec<Vec<usize>>,
    pub representatives: Vec<usize>,
    /// Drift checks that re-clustered this layer (`drift=`).
    pub reclustered: usize,
    /// Largest member-to-representative distance seen at a drift check.
    pub max_drift: f64,
}

/// Per-request CHAI state. Cloning it (beam search) gives a beam the
/// request's clusters, or the probe collected so far.
#[derive(Clone)]
pub struct HeadSharing {
    pub spec: HeadSharingSpec,
    /// The spec's plan, checked present and fitting the model.
    plan: Arc<ChaiPlan>,
    n_heads: usize,
    n_kv_heads: usize,
    /// None until clustering; then per layer (dense layers included).
    layers: Option<Vec<LayerHeads>>,
    /// [layer][head]: flattened lower-triangle probe rows.
    probe_rows: Vec<Vec<Vec<f32>>>,
    /// Drift checks: tokens since the last one, steps of the current
    /// re-probe still to run (layers then run dense), its attention rows
    /// [layer][head] concatenated, and per layer the re-clusterings and
    /// largest distance.
    since_check: usize,
    check_left: usize,
    check_rows: Vec<Vec<Vec<f32>>>,
    reclustered: Vec<usize>,
    max_drift: Vec<f64>,
}

impl HeadSharing {
    /// Checks the plan against the model.
    pub fn new(spec: HeadSharingSpec, n_layers: usize, n_heads: usize, n_kv_heads: usize) -> Result<Self, String> {
        let plan = Arc::clone(spec.plan()?);
        plan.validate(n_layers, n_heads).map_err(|e| format!("CHAI plan {}: {e}", spec.plan_path))?;
        let group = n_heads / n_kv_heads.max(1);
        if plan.group != 0 && plan.group != group {
            return Err(format!(
                "CHAI plan {}: made for {} query heads per KV head, the model has {group}",
                spec.plan_path, plan.group
            ));
        }
        for (l, lp) in plan.layers.iter().enumerate() {
            if lp.kv_keep.is_some_and(|keep| keep > n_kv_heads || lp.k != keep * group) {
                return Err(format!(
                    "CHAI plan {}: layer {l}: kv_keep = {} does not fit {n_kv_heads} KV heads of {group} query heads with k = {}",
                    spec.plan_path,
                    lp.kv_keep.unwrap_or(0),
                    lp.k
                ));
            }
        }
        if spec.fixed && !plan.has_static() {
            return Err(format!("CHAI plan {} has no static membership for chai-static", spec.plan_path));
        }
        let feat = probe_feature_len(spec.probe);
        Ok(HeadSharing {
            plan,
            n_heads,
            n_kv_heads,
            layers: None,
            probe_rows: vec![vec![vec![0f32; feat]; n_heads]; n_layers],
            since_check: 0,
            check_left: 0,
            check_rows: if spec.drift.is_some() { vec![vec![Vec::new(); n_heads]; n_layers] } else { Vec::new() },
            reclustered: vec![0; n_layers],
            max_drift: vec![0.0; n_layers],
            spec,
        })
    }

    /// True while the probe is still being collected (online CHAI only).
    pub fn collecting_probe(&self) -> bool {
        self.layers.is_none() && !self.spec.fixed
    }

    /// True while every head's attention is wanted: the probe, or a drift
    /// check step (every head then runs on its own keys).
    pub fn recording(&self) -> bool {
        self.collecting_probe() || self.check_left > 0
    }

    /// Probe length in tokens.
    pub fn probe_len(&self) -> usize {
        self.spec.probe
    }

    /// Records query head `head`'s attention at position `pos` (< probe)
    /// over the slots with `positions` (probabilities aligned with them);
    /// during a drift re-probe, appends the whole row.
    pub fn record_probe(&mut self, layer: usize, head: usize, pos: usize, positions: &[u32], probs: &[f32]) {
        if self.check_left > 0 {
            // the step's whole row (every KV head holds the same positions:
            // drift checks need the full token policy)
            self.check_rows[layer][head].extend_from_slice(&probs[..positions.len()]);
            return;
        }
        if pos >= self.spec.probe || !self.collecting_probe() {
            return;
        }
        let row = &mut self.probe_rows[layer][head][pos * (pos + 1) / 2..(pos + 1) * (pos + 2) / 2];
        for (p, &w) in positions.iter().zip(probs) {
            if (*p as usize) <= pos {
                row[*p as usize] = w;
            }
        }
    }

    /// Clusters every layer (from the probe, or the plan's static
    /// membership) and frees the K of KV heads no representative reads.
    pub fn finish(&mut self, store: &mut KvStore) {
        if self.layers.is_some() {
            return;
        }
        let g = self.n_heads / self.n_kv_heads;
        let plan = Arc::clone(&self.plan);
        let layers: Vec<LayerHeads> = plan
            .layers
            .iter()
            .enumerate()
            .map(|(l, lp)| {
                if lp.k >= self.n_heads {
                    LayerHeads::dense(self.n_heads, self.n_kv_heads)
                } else if self.spec.fixed && !lp.static_representatives.is_empty() {
                    let pairs = lp.static_representatives.iter().copied().zip(lp.static_clusters.iter().cloned());
                    LayerHeads::from_clusters(&HeadClusters::with_representatives(pairs.collect()), self.n_kv_heads)
                } else if self.spec.fixed {
                    // static membership; representatives are the first head of each cluster
                    let hc = HeadClusters::from_clusters(lp.static_clusters.clone(), &[], RepRule::First);
                    LayerHeads::from_clusters(&hc, self.n_kv_heads)
                } else if let Some(keep) = lp.kv_keep {
                    LayerHeads::from_clusters(&cluster_by_kv_groups(&self.probe_rows[l], g, keep), self.n_kv_heads)
                } else {
                    let hc = cluster_heads(&self.probe_rows[l], lp.k, self.spec.rep);
                    LayerHeads::from_clusters(&hc, self.n_kv_heads)
                }
            })
            .collect();
        if self.spec.drift.is_none() {
            for (l, lh) in layers.iter().enumerate() {
                for (kv, used) in lh.kv_heads_with_keys(g).into_iter().enumerate() {
                    if !used {
                        store.head_mut(l, kv).drop_keys();
                    }
                }
            }
        }
        self.layers = Some(layers);
    }

    /// After `n` tokens (once clustered, with `drift=`): starts a re-probe
    /// every `every` tokens, and after its last step re-clusters each shared
    /// layer whose largest member-to-representative distance exceeds the
    /// threshold, from the re-probe's rows.
    pub fn after_tokens(&mut self, n: usize) {
        let (Some(drift), Some(layers)) = (self.spec.drift, self.layers.as_mut()) else { return };
        if self.check_left == 0 {
            self.since_check += n;
            if self.since_check >= drift.every {
                self.check_left = self.spec.probe;
                self.check_rows.iter_mut().flatten().for_each(Vec::clear);
            }
            return;
        }
        self.check_left = self.check_left.saturating_sub(n);
        if self.check_left > 0 {
            return;
        }
        self.since_check = 0;
        let g = self.n_heads / self.n_kv_heads;
        for (l, lp) in self.plan.layers.iter().enumerate() {
            let rows = &self.check_rows[l];
            if lp.k >= self.n_heads || rows.iter().any(Vec::is_empty) {
                continue;
            }
            let dist = cosine_distances(rows);
            let lh = &layers[l];
            let worst = (0..self.n_heads).map(|h| dist[h][lh.representative_of[h]]).fold(0.0, f64::max);
            self.max_drift[l] = self.max_drift[l].max(worst);
            if worst > drift.threshold {
                let hc = match lp.kv_keep {
                    Some(keep) => cluster_by_kv_groups(rows, g, keep),
                    None => cluster_heads(rows, lp.k, self.spec.rep),
                };
                layers[l] = LayerHeads::from_clusters(&hc, self.n_kv_heads);
                self.reclustered[l] += 1;
            }
        }
    }

    /// The layer's head structure once clustered (`None` before, and during
    /// a drift check step, when every head attends on its own).
    pub fn layer(&self, l: usize) -> Option<&LayerHeads> {
        if self.check_left > 0 {
            return None;
        }
        self.layers.as_ref().map(|v| &v[l])
    }

    /// Clusters and representatives per layer (empty before clustering).
    pub fn report(&self) -> Vec<LayerClustersReport> {
        self.layers
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, l)| LayerClustersReport {
                clusters: l.clusters.clone(),
                representatives: l.clusters.iter().map(|c| l.representative_of[c[0]]).collect(),
                reclustered: self.reclustered[i],
                max_drift: self.max_drift[i],
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_layer_has_one_component_per_kv_head() {
        let l = LayerHeads::dense(6, 3);
        assert_eq!(l.components.len(), 3);
        assert_eq!(l.components[1], Component { kv_heads: vec![1], leader: 1, reps: vec![2, 3] });
    }

    #[test]
    fn gqa_clusters_tie_kv_heads_together() {
        // 6 query heads, 3 KV heads (group 2); clusters {0,2}, {1}, {3}, {4,5}
        let hc = HeadClusters::from_clusters(vec![vec![0, 2], vec![1], vec![3], vec![4, 5]], &[], RepRule::First);
        let l = LayerHeads::from_clusters(&hc, 3);
        // head 2 (KV 1) reads head 0's scores (KV 0): KV 0 and 1 are tied
        assert_eq!(l.components.len(), 2);
        assert_eq!(l.components[0].kv_heads, vec![0, 1]);
        assert_eq!(l.components[0].reps, vec![0, 1, 3]);
        assert_eq!(l.components[1], Component { kv_heads: vec![2], leader: 2, reps: vec![4] });
        assert_eq!(l.kv_heads_with_keys(2), vec![true, true, true]);
        // MHA: members' heads lose their keys
        let hc = HeadClusters::from_clusters(vec![vec![0, 1, 3], vec![2]], &[], RepRule::First);
        let l = LayerHeads::from_clusters(&hc, 4);
        assert_eq!(l.kv_heads_with_keys(1), vec![true, false, true, false]);
        assert_eq!(l.components[0], Component { kv_heads: vec![0, 1, 3], leader: 0, reps: vec![0] });
    }
}
