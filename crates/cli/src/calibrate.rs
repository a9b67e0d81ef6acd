//! `kvslim calibrate`: the offline half of CHAI.

use crate::common::{require_tokenizer, CliResult, ModelArgs, Progress};
use kvslim_cache::policy::chai::CalibrationConfig;
use kvslim_engine::calibrate::{calibrate, calibration_windows, CalibrateOptions};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Calibration text (tokenized with the model's tokenizer).
    #[arg(long)]
    text: PathBuf,
    /// Number of calibration windows.
    #[arg(long, default_value_t = 64)]
    samples: usize,
    /// The text is cut into consecutive windows of this many tokens; each
    /// window is a fresh sequence (BOS as the tokenizer says) whose first
    /// --probe tokens give every head's feature.
    #[arg(long, default_value_t = 128)]
    seq_len: usize,
    /// Probe length: tokens whose causal attention is a head's feature
    /// (must match the online `probe=` of the policy; the paper uses 5).
    #[arg(long, default_value_t = 5)]
    probe: usize,
    /// Largest cluster count searched per layer (default: all heads).
    #[arg(long, default_value_t = 0)]
    max_k: usize,
    /// Keep the first N layers dense (k = heads), as the paper does for LLaMA-7B.
    #[arg(long, default_value_t = 0)]
    dense_layers: usize,
    /// K-means restarts per k.
    #[arg(long, default_value_t = 10)]
    restarts: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to write the plan (JSON).
    #[arg(long)]
    out: PathBuf,
    /// Also draw every layer's error curve with the chosen k marked
    /// (`layer_NN.png` and `.svg` in this directory).
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
}

pub fn run(a: Args) -> CliResult {
    let loaded = a.model.load()?;
    let tok = require_tokenizer(&loaded.tokenizer)?;
    let text = std::fs::read_to_string(&a.text).map_err(|e| format!("cannot read {}: {e}", a.text.display()))?;
    let ids = tok.encode(&text)?;
    if a.seq_len < a.probe {
        return Err(format!("--seq-len {} is shorter than the probe ({})", a.seq_len, a.probe).into());
    }
    let windows = calibration_windows(&ids, tok.bos.filter(|_| tok.add_bos), a.samples, a.seq_len)?;
    let n = windows.len();
    if n < a.samples {
        eprintln!("note: the text holds only {n} windows of {} tokens; using them all", a.seq_len);
    }
    let opts = CalibrateOptions {
        probe: a.probe,
        config: CalibrationConfig { max_k: a.max_k, dense_layers: a.dense_layers, restarts: a.restarts, seed: a.seed },
        model_name: a.model.model.clone(),
        seq_len: a.seq_len,
    };
    let start = std::time::Instant::now();
    let mut progress = Progress::new("calibrate", "windows");
    let plan = calibrate(&loaded.model, &windows, &opts, |d, t| progress.update(d, t))?;
    plan.save(&a.out)?;
    if let Some(dir) = &a.plot {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        for (l, lp) in plan.layers.iter().enumerate() {
            let curve: Vec<(f64, f64)> = lp.errors.iter().enumerate().map(|(i, e)| ((i + 1) as f64, *e)).collect();
            let chosen = curve.get(lp.k - 1).copied().into_iter().collect();
            let chart = kvslim_eval::chart::Chart::new(format!("layer {l}: K-means error, chosen k = {}", lp.k))
                .x_label("k (clusters)")
                .y_label("mean inertia")
                .series("E(k)", curve)
                .series(format!("chosen k={}", lp.k), chosen);
            for ext in ["png", "svg"] {
                let path = dir.join(format!("layer_{l:02}.{ext}"));
                chart.save(&path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            }
        }
        eprintln!("elbow plots written to {}", dir.display());
    }
    let ks: Vec<String> = plan.layers.iter().map(|l| l.k.to_string()).collect();
    eprintln!(
        "calibrated {} windows in {:.1} s; k per layer: [{}]; plan written to {}",
        n,
        start.elapsed().as_secs_f64(),
        ks.join(", "),
        a.out.display()
    );
    Ok(())
}
