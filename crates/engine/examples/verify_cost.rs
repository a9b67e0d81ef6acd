//! Cost of verifying a chunk of drafts: one decode step, `forward_sequential`
//! (exact, GEMV per token) and `forward_verify` (GEMM over the chunk), for
//! chunks of 2..=8 tokens after a 64-token prompt; medians of 15 runs.
//!   cargo run --release -p kvslim-engine --example verify_cost -- MODEL [THREADS]
use kvslim_cache::PolicySpec;
use kvslim_models::{load_model, Logits, Scratch};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: verify_cost MODEL [THREADS]");
    let threads: usize = args.get(2).map_or(2, |t| t.parse().expect("threads"));
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().expect("thread pool");
    let m = load_model(std::path::Path::new(path)).expect("model").model;
    let prompt: Vec<u32> = (0..64).map(|i| (i * 7 + 3) % 1000).collect();
    let spec = PolicySpec::full();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // on a pool worker, as the CLI runs the model (see `on_workers`)
    kvslim_engine::on_workers(|| table(&m, &prompt, &spec, median));
}

fn table(m: &kvslim_models::Model, prompt: &[u32], spec: &PolicySpec, median: impl Fn(Vec<f64>) -> f64) {
    println!("| chunk | decode step ms | sequential ms | verify ms |");
    println!("|---:|---:|---:|---:|");
    for n in [1usize, 2, 3, 5, 8] {
        let chunk: Vec<u32> = (0..n as u32).map(|i| 100 + i).collect();
        let (mut step, mut seq, mut ver) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..15 {
            for (mode, out) in [(0, &mut step), (1, &mut seq), (2, &mut ver)] {
                let mut cache = m.new_cache(spec, 128, 128).expect("cache");
                let mut s = Scratch::new();
                m.forward(prompt, &mut cache, &mut s, Logits::Last).expect("prefill");
                let t = Instant::now();
                match mode {
                    0 => m.forward(&chunk[..1], &mut cache, &mut s, Logits::Last).expect("step"),
                    1 => m.forward_sequential(&chunk, &mut cache, &mut s).expect("sequential"),
                    _ => m.forward_verify(&chunk, &mut cache, &mut s).expect("verify"),
                }
                out.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        println!("| {n} | {:.2} | {:.2} | {:.2} |", median(step), median(seq), median(ver));
    }
}
