//! CHAI (clustered head attention, docs/policies.md §2): the clustering math, with no
//! model or kernel code, so the engine and the calibration tool share one
//! tested implementation.
//!
//! - [`linkage`]: cosine distances, average-linkage clustering, canonical
//!   clusters, representatives (`first` / `medoid`).
//! - [`kmeans`](mod@kmeans): seeded K-means (k-means++ and restarts) and error curves.
//! - [`elbow`]: the rule choosing k_l from an error curve.
//! - [`online`]: per-request probe features and head clustering.
//! - [`calibrate`]: offline accumulation into a plan.
//! - [`plan`]: the JSON plan file.

pub mod calibrate;
pub mod elbow;
pub mod kmeans;
pub mod linkage;
pub mod online;
pub mod plan;
pub mod sharing;

pub use calibrate::{CalibrationConfig, Calibrator, LayerAccumulator, PlanMeta};
pub use elbow::{choose_elbow, elbow_scores, ELBOW_RULE};
pub use kmeans::{error_curve, kmeans, SplitMix64};
pub use linkage::{
    average_linkage, canonicalize, clusters_from_labels, cosine_distances, labels_from_clusters, medoid,
    representatives, RepRule,
};
pub use online::{
    cluster_by_kv_groups, cluster_heads, probe_feature, probe_feature_len, probe_feature_strided, HeadClusters,
};
pub use plan::{ChaiPlan, LayerPlan, PlanError, QualityRecord};
pub use sharing::{Component, Drift, HeadSharing, HeadSharingSpec, LayerClustersReport, LayerHeads};
