//! `kvslim calibrate`: the offline half of CHAI, or (`--kvzap`) a
//! KVzap-style predictor for `prefill=kvzap`.

use crate::common::{require_tokenizer, CalibrationText, CliResult, ModelArgs, Progress};
use kvslim_cache::policy::chai::CalibrationConfig;
use kvslim_engine::calibrate::{
    calibrate_quality, calibration_windows, probe_features, second_half_start, text_tokens, CalibrateOptions,
};
use kvslim_engine::kvzap::{collect_pairs, fit_kvzap, mixed_windows, KvzapOptions};
use kvslim_models::kvzap::{kvzap_file_name, kvzap_user_dir};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    text: CalibrationText,
    /// Fit a KVzap-style predictor for `prefill=kvzap` instead of a CHAI
    /// plan: KVzip-style prefills of --samples windows (default 12) of
    /// --seq-len tokens (default 2048) from the text's second half, evicting
    /// nothing, give every token's KVzip score per layer and KV head; a
    /// ridge regression per layer and KV head predicts its log from the
    /// layer's normalised hidden state; --held-out more windows pick the
    /// ridge strength and measure the fit. Written to --out, or without it
    /// to `$KVSLIM_KVZAP_DIR` or `~/.cache/kvslim/kvzap/<model fingerprint>.kvzap`,
    /// where `prefill=kvzap` finds it.
    #[arg(long)]
    kvzap: bool,
    /// More calibration text for --kvzap (repeatable), e.g. code beside
    /// prose: the windows are shared out evenly over --text and these,
    /// each drawn from its own text's second half, and interleaved.
    #[arg(long, value_name = "TEXT", requires = "kvzap")]
    also_text: Vec<PathBuf>,
    /// With --kvzap, also write every window's training pairs to this
    /// folder (`manifest.json` and one raw little-endian f32 file per
    /// window: per layer the normalised hidden states `[n, hidden]`, then
    /// per layer and KV head the scores `[n]`), to fit other predictors
    /// offline (`scripts/kvzap_mlp.py`).
    #[arg(long, value_name = "DIR", requires = "kvzap")]
    dump_pairs: Option<PathBuf>,
    /// Held-out windows for --kvzap (ridge strength and fit quality).
    #[arg(long, default_value_t = 2)]
    held_out: usize,
    /// Number of calibration windows (default 64; 12 with --kvzap).
    #[arg(long)]
    samples: Option<usize>,
    /// Tokens per calibration window, the BOS included (as `tune`'s and
    /// evaluation's `seq_len`): the windows are spread over the text, each
    /// a fresh sequence whose first --probe tokens give every head's feature
    /// (default 128; 2048 with --kvzap).
    #[arg(long)]
    seq_len: Option<usize>,
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
    /// Choose each layer's sharing by measured quality instead of the elbow:
    /// GQA-aware sharing (`kv_keep` per layer: KV heads that keep K; the
    /// query heads of the others use their most similar kept head's scores)
    /// under this budget of mean KL(full‖plan) per token, measured on
    /// --kl-windows windows of --kl-seq-len tokens from the second half of
    /// the text. Layers where sharing costs most stay dense. Several budgets
    /// (`0.05,0.2,1`) share one set of measurements and write one plan each,
    /// named `OUT-kl<budget>.json`.
    #[arg(long, value_name = "NATS", value_delimiter = ',', num_args = 1..)]
    max_kl: Vec<f64>,
    /// Windows the quality search measures KL on (with --max-kl).
    #[arg(long, default_value_t = 2)]
    kl_windows: usize,
    /// Tokens per quality window, the BOS included (with --max-kl).
    #[arg(long, default_value_t = 512)]
    kl_seq_len: usize,
    /// Where to write the plan (JSON) or, with --kvzap, the predictor.
    #[arg(long, short = 'o')]
    out: Option<PathBuf>,
    /// Also draw every layer's error curve with the chosen k marked
    /// (`layer_NN.png` and `.svg` in this directory).
    #[arg(long, value_name = "DIR", conflicts_with = "max_kl")]
    plot: Option<PathBuf>,
}

pub fn run(a: Args) -> CliResult {
    if a.kvzap {
        return run_kvzap(a);
    }
    let out = a.out.clone().ok_or("--out FILE is required: where to write the CHAI plan")?;
    let (samples, seq_len) = (a.samples.unwrap_or(64), a.seq_len.unwrap_or(128));
    let loaded = a.model.load()?;
    let tok = require_tokenizer(&loaded.tokenizer)?;
    let text =
        std::fs::read_to_string(&a.text.path).map_err(|e| format!("cannot read {}: {e}", a.text.path.display()))?;
    let ids = tok.encode(&text)?;
    if seq_len < a.probe {
        return Err(format!("--seq-len {seq_len} is shorter than the probe ({})", a.probe).into());
    }
    let windows = calibration_windows(&ids, tok.prepended_bos(), samples, seq_len)?;
    let n = windows.len();
    if n < samples {
        eprintln!("note: the text holds only {n} windows of {seq_len} tokens; using them all");
    }
    let opts = CalibrateOptions {
        probe: a.probe,
        config: CalibrationConfig { max_k: a.max_k, dense_layers: a.dense_layers, restarts: a.restarts, seed: a.seed },
        model_name: a.model.model.clone(),
        seq_len,
    };
    let start = std::time::Instant::now();
    let mut progress = Progress::new("calibrate", "windows");
    let (cal, plan) = probe_features(&loaded.model, &windows, &opts, |d, t| progress.update(d, t))?;
    if !a.max_kl.is_empty() {
        // quality windows from the second half of the text's tokens
        let bos = tok.prepended_bos();
        let body = text_tokens(&ids, bos);
        let second = &body[second_half_start(body.len())..];
        let fits = loaded.model.config.context_len;
        if a.kl_seq_len > fits {
            eprintln!("note: quality windows cut to {fits} tokens (the model's context)");
        }
        let kl_windows = calibration_windows(second, bos, a.kl_windows, a.kl_seq_len.min(fits))?;
        let mut progress = Progress::new("quality", "plans");
        let plans = calibrate_quality(&loaded.model, &cal, plan, &kl_windows, &a.max_kl, |d, t| progress.update(d, t))?;
        let several = plans.len() > 1;
        for p in &plans {
            let q = p.quality.as_ref().expect("quality plans carry their record");
            let path = if several { budget_path(&out, q.max_kl) } else { out.clone() };
            let keeps: Vec<String> = p.layers.iter().map(|l| l.kv_keep.map_or("-".into(), |k| k.to_string())).collect();
            eprintln!(
                "max KL {}: {} KV heads' K freed, KL {:.4} measured ({:.4} predicted); kv_keep per layer (- dense): [{}] -> {}",
                q.max_kl,
                q.kv_heads_freed,
                q.measured_kl,
                q.predicted_kl,
                keeps.join(", "),
                path.display()
            );
            p.save(&path)?;
        }
        eprintln!("calibrated in {:.1} s", start.elapsed().as_secs_f64());
        return Ok(());
    }
    plan.save(&out)?;
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
        out.display()
    );
    Ok(())
}

/// `--kvzap`: windows from the text's second half (the first half stays
/// free for evaluation), KVzip scores and hidden states per window, the
/// fit, the file.
fn run_kvzap(a: Args) -> CliResult {
    let (samples, seq_len) = (a.samples.unwrap_or(12), a.seq_len.unwrap_or(2048));
    if samples == 0 {
        return Err("--samples must be at least 1".into());
    }
    let loaded = a.model.load()?;
    let model = &loaded.model;
    let tok = require_tokenizer(&loaded.tokenizer)?;
    let fits = model.config.context_len / 2;
    if seq_len > fits {
        return Err(format!(
            "--seq-len {seq_len}: the KVzip probe repeats each window, so a window must fit half the model's context ({fits})"
        )
        .into());
    }
    let total = samples + a.held_out;
    let texts: Vec<&PathBuf> = std::iter::once(&a.text.path).chain(&a.also_text).collect();
    let mut encoded = Vec::with_capacity(texts.len());
    for path in &texts {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        encoded.push((path.display().to_string(), tok.encode(&text)?));
    }
    let windows = mixed_windows(&encoded, tok.prepended_bos(), total, seq_len).map_err(|e| {
        format!("{e} (--samples {samples} + --held-out {} windows over {} texts)", a.held_out, texts.len())
    })?;
    // every k-th window is held out, so both sets span the text
    let every = total.checked_div(a.held_out).unwrap_or(usize::MAX);
    let held = |i: usize| a.held_out > 0 && (i + 1).is_multiple_of(every) && (i + 1) / every <= a.held_out;
    let fingerprint = model.fingerprint();
    let out = match &a.out {
        Some(p) => p.clone(),
        None => kvzap_user_dir()
            .ok_or("no place for the predictor: set KVSLIM_KVZAP_DIR or HOME, or give --out FILE")?
            .join(kvzap_file_name(&fingerprint)),
    };
    if let Some(dir) = &a.dump_pairs {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let mut dumped = Vec::new();
    let start = std::time::Instant::now();
    let (mut train, mut held_out) = (Vec::new(), Vec::new());
    let mut progress = Progress::new("kvzap", "windows");
    progress.update(0, total);
    for (i, w) in windows.iter().enumerate() {
        let pairs = kvslim_engine::on_workers(|| collect_pairs(model, w))?;
        if let Some(dir) = &a.dump_pairs {
            let file = format!("window-{i:03}.f32");
            let path = dir.join(&file);
            let mut out = std::io::BufWriter::new(
                std::fs::File::create(&path).map_err(|e| format!("cannot write {}: {e}", path.display()))?,
            );
            pairs
                .write_raw(&mut out)
                .and_then(|_| std::io::Write::flush(&mut out))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            dumped.push(serde_json::json!({"file": file, "tokens": pairs.n, "held_out": held(i)}));
        }
        if held(i) {
            held_out.push(pairs);
        } else {
            train.push(pairs);
        }
        progress.update(i + 1, total);
    }
    let labels: Vec<&str> = encoded.iter().map(|(label, _)| label.as_str()).collect();
    if let Some(dir) = &a.dump_pairs {
        let c = &model.config;
        let manifest = serde_json::json!({
            "model": fingerprint, "layers": c.n_layers, "kv_heads": c.n_kv_heads, "hidden": c.hidden_size,
            "text": labels.join(" + "), "seq_len": seq_len, "windows": dumped,
        });
        let path = dir.join("manifest.json");
        std::fs::write(&path, serde_json::to_string_pretty(&manifest).unwrap_or_default())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let opts = KvzapOptions { text: labels.join(" + "), seq_len };
    let mut progress = Progress::new("fit", "layers");
    let (predictor, q) =
        kvslim_engine::on_workers(|| fit_kvzap(model, &train, &held_out, &opts, |d, t| progress.update(d, t)))?;
    predictor.save(&out)?;
    eprintln!(
        "KVzap predictor for {fingerprint}: {} windows of {seq_len} tokens, {} held out; held-out Spearman {:.3} \
         (lowest unit {:.3}), R² {:.3}; global selection kept by the prediction: {:.1}% at 12.5%, {:.1}% at 25%; \
         {:.1} s -> {}",
        train.len(),
        held_out.len(),
        q.spearman_mean,
        q.spearman_min,
        q.r2_mean,
        100.0 * q.global_overlap_12_5,
        100.0 * q.global_overlap_25,
        start.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

/// `plan.json` + 0.05 → `plan-kl0.05.json` (one file per budget).
fn budget_path(out: &std::path::Path, max_kl: f64) -> PathBuf {
    let stem = out.file_stem().map_or("plan".into(), |s| s.to_string_lossy().into_owned());
    let ext = out.extension().map_or("json".into(), |e| e.to_string_lossy().into_owned());
    out.with_file_name(format!("{stem}-kl{max_kl}.{ext}"))
}
