//! GEMV throughput per weight type and kernel set, next to a plain memory
//! bandwidth measurement; also kernel-only and prefill GEMM modes.
//!
//! ```text
//! cargo run --release -p kvslim-kernels --example dotbench [-- --secs 0.5]
//! cargo run --release -p kvslim-kernels --example dotbench -- --kernels
//! cargo run --release -p kvslim-kernels --example dotbench -- --gemm
//! cargo run --release -p kvslim-kernels --example dotbench -- --prefill --types q4_1,q8_0,q4_k,q5_0,q6_k
//! cargo run --release -p kvslim-kernels --example dotbench -- --mem
//! cargo run --release -p kvslim-kernels --example dotbench -- --softmax
//! cargo run --release -p kvslim-kernels --example dotbench -- --tiled
//! cargo run --release -p kvslim-kernels --example dotbench -- --kernels --types q4_1,q4_k,q5_0,q6_k,q8_0
//! ```
//!
//! `--types` limits the weight types measured (default: all of them).
//!
//! Default mode: GB/s of weight bytes streamed by `Matrix::matvec` on a
//! 4096×4096 matrix, with 1 and 2 rayon threads. "cold": the product rotates
//! over copies of the matrix totalling at least 1 GiB (like the bandwidth
//! test), so weights come from DRAM as in real decoding; "hot": the same
//! matrix again and again (it may sit in the last-level cache, which shows
//! the kernel's compute limit). Each kernel set runs in a child process with
//! `KVSLIM_SIMD` set, since the set is chosen once per process. Every figure
//! is the best of five trials, as the machine may be shared.
//!
//! `--kernels`: single-thread kernel speed on L2-resident rows (no DRAM),
//! the GEMM tile, and attention-sized dots. `--gemm`: `Matrix::matmul`
//! against one-dot-per-token. `--prefill`: `Matrix::matmul` alone at
//! prefill shapes of SmolLM2-135M (n = 512 tokens × 576×576 and
//! 1536×576), 1 and 2 threads. `--mem`: only the bandwidth test.
//! `--softmax`: `ops::log_sum_exp` and `ops::kl_divergence` on a
//! vocabulary row (SmolLM2's 49,152 and Gemma 3's 262,144 logits) against
//! a scalar libm `exp` in f64, the per-token cost of scoring.
//! `--tiled`: one block of 16 prefill queries at the end of a 4K to
//! 64K-token prompt through `attend_causal_tiled` (one KV head of
//! Qwen2.5-Coder-1.5B: 6 query heads over a KV head of 128, as the prefill
//! calls it per component), one thread, with and without the column scores
//! a bounded policy's prefill asks for.

use kvslim_kernels::dot::available;
use kvslim_kernels::{DType, Matrix};
use rayon::prelude::*;
use std::process::Command;
use std::time::{Duration, Instant};

const N: usize = 4096;
const COLD_BYTES: usize = 1 << 30;
/// The weight types measured unless `--types a,b,...` names others.
const DTYPES: [DType; 13] = DType::ALL;

/// `--types q4_1,q4_k,...` (any `DType` names), else every type.
fn dtypes(args: &[String]) -> Vec<DType> {
    match args.iter().position(|a| a == "--types").and_then(|i| args.get(i + 1)) {
        Some(list) => list
            .split(',')
            .map(|t| DType::parse(t.trim()).unwrap_or_else(|| panic!("unknown type `{t}` in --types")))
            .collect(),
        None => DTYPES.to_vec(),
    }
}
const THREADS: [usize; 2] = [1, 2];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs = args
        .iter()
        .position(|a| a == "--secs")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(0.3);
    let types = dtypes(&args);
    if args.iter().any(|a| a == "--child") {
        return child(secs, &types);
    }
    if args.iter().any(|a| a == "--kernels") {
        return kernel_only(secs, &types);
    }
    if args.iter().any(|a| a == "--gemm") {
        return gemm(secs, &types);
    }
    if args.iter().any(|a| a == "--prefill") {
        return prefill(secs, &types);
    }
    if args.iter().any(|a| a == "--softmax") {
        return softmax(secs);
    }
    if args.iter().any(|a| a == "--tiled") {
        return tiled(secs);
    }

    println!("memory bandwidth (sum over a 1 GiB f32 array):");
    let bw: Vec<f64> = THREADS.iter().map(|&t| mem_bandwidth(t, secs)).collect();
    for (t, g) in THREADS.iter().zip(&bw) {
        println!("  {t} thread(s): {g:.1} GB/s");
    }

    if args.iter().any(|a| a == "--mem") {
        return;
    }
    let exe = std::env::current_exe().expect("current exe");
    // results[isa] = lines "dtype threads cold hot"
    let mut results = Vec::new();
    for k in available() {
        eprintln!("running {} ...", k.isa);
        let list = types.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",");
        let out = Command::new(&exe)
            .args(["--child", "--secs", &secs.to_string(), "--types", &list])
            .env("KVSLIM_SIMD", k.isa.name())
            .output()
            .expect("spawn child");
        assert!(out.status.success(), "child {} failed", k.isa);
        results.push((k.isa, String::from_utf8(out.stdout).unwrap()));
    }

    for (label, col) in [("cold (DRAM)", 2usize), ("hot (single matrix)", 3)] {
        println!("\nmatvec {N}x{N}, GB/s of weights, {label}:");
        let mut header = String::from("| dtype |");
        let mut rule = String::from("|---|");
        for (isa, _) in &results {
            for t in THREADS {
                header += &format!(" {isa} {t}T |");
                rule += "---:|";
            }
        }
        println!("{header}\n{rule}");
        for &dt in &types {
            let mut line = format!("| {dt} |");
            for (_, out) in &results {
                for t in THREADS {
                    let v = out
                        .lines()
                        .map(|l| l.split_whitespace().collect::<Vec<_>>())
                        .find(|f| f[0] == dt.to_string() && f[1] == t.to_string())
                        .map(|f| f[col].to_string())
                        .unwrap_or_else(|| "-".into());
                    line += &format!(" {v} |");
                }
            }
            println!("{line}");
        }
    }
    println!(
        "\nmemory bandwidth: {}",
        THREADS.iter().zip(&bw).map(|(t, g)| format!("{t}T {g:.1} GB/s")).collect::<Vec<_>>().join(", ")
    );
}

/// Runs `f` repeatedly for about `secs` seconds, in five trials; returns
/// the calls per second of the best trial (the machine may be shared, and
/// interference only ever slows a trial down).
/// A 64-bit LCG: deterministic benchmark data.
struct Lcg(u64);

impl Lcg {
    /// `n` values uniform in [-0.5, 0.5).
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }
}

fn rate(secs: f64, mut f: impl FnMut()) -> f64 {
    f(); // warm up
    let budget = Duration::from_secs_f64(secs / 5.0);
    let mut best = 0f64;
    for _ in 0..5 {
        let start = Instant::now();
        let mut calls = 0u64;
        while calls == 0 || start.elapsed() < budget {
            f();
            calls += 1;
        }
        best = best.max(calls as f64 / start.elapsed().as_secs_f64());
    }
    best
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool")
}

fn mem_bandwidth(threads: usize, secs: f64) -> f64 {
    let n = (1usize << 30) / 4;
    let data: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let mut sink = 0f32;
    let per_sec = pool(threads).install(|| {
        rate(secs.max(2.0), || {
            sink += data.par_chunks(1 << 20).map(kvslim_kernels::ops::streaming_sum).sum::<f32>();
        })
    });
    std::hint::black_box(sink);
    per_sec * (n * 4) as f64 / 1e9
}

fn child(secs: f64, types: &[DType]) {
    let isa = kvslim_kernels::dot::kernels().isa;
    eprintln!("  child: kernels {isa}");
    let data: Vec<f32> = Lcg(0x1234_5678_9abc_def0).vec(N * N).iter().map(|v| v * 0.1).collect();
    let x: Vec<f32> = data[..N].iter().map(|v| v * 10.0).collect();
    let mut out = vec![0f32; N];
    for &dt in types {
        let bytes = kvslim_kernels::quant::quantize(dt, &data);
        let base = Matrix::from_bytes(dt, N, N, &bytes).unwrap();
        let copies: Vec<Matrix> =
            (0..COLD_BYTES.div_ceil(bytes.len())).map(|_| Matrix::from_bytes(dt, N, N, &bytes).unwrap()).collect();
        let nbytes = base.nbytes() as f64;
        for t in THREADS {
            let p = pool(t);
            let mut i = 0;
            let cold = p.install(|| {
                rate(secs, || {
                    copies[i % copies.len()].matvec(&x, &mut out);
                    i += 1;
                })
            });
            let hot = p.install(|| rate(secs, || base.matvec(&x, &mut out)));
            println!("{dt} {t} {:.1} {:.1}", cold * nbytes / 1e9, hot * nbytes / 1e9);
        }
    }
    std::hint::black_box(&out);
}

/// Single-thread kernel speed on rows that stay in L2 (no DRAM traffic):
/// GB/s of weight bytes per kernel set and type, and rows of 4096 per µs
/// (comparable across types of different sizes).
fn kernel_only(secs: f64, types: &[DType]) {
    const ROWS: usize = 64;
    let data = Lcg(99).vec(ROWS * N);
    let x = &data[..N];
    let sets = available();
    println!("GB/s of weights (rows of {N} per µs), one thread, L2-resident rows:");
    print!("| dtype |");
    for k in &sets {
        print!(" {} |", k.isa);
    }
    println!();
    for &dt in types {
        let raw = kvslim_kernels::quant::quantize(dt, &data[..ROWS * N]);
        let rb = raw.len() / ROWS;
        print!("| {dt} |");
        for k in &sets {
            let mut sink = 0f32;
            let per_sec = rate(secs, || {
                for r in 0..ROWS {
                    sink += kvslim_kernels::dot::dot_row(k, dt, &raw[r * rb..(r + 1) * rb], x);
                }
            });
            std::hint::black_box(sink);
            print!(" {:.1} ({:.2}) |", per_sec * raw.len() as f64 / 1e9, per_sec * ROWS as f64 / 1e6);
        }
        println!();
    }
    // GEMM micro-tile on L1-resident rows
    for len in [512usize, 4096] {
        let r: Vec<&[f32]> = (0..8).map(|i| &data[i * len..(i + 1) * len]).collect();
        let (w4, x4) = ([r[0], r[1], r[2], r[3]], [r[4], r[5], r[6], r[7]]);
        print!("| dot4x4 len={len} (GFLOP/s) |");
        for k in &sets {
            let mut tile = [[0f32; 4]; 4];
            let per_sec = rate(secs, || (k.dot4x4)(&w4, &x4, &mut tile));
            std::hint::black_box(tile);
            print!(" {:.1} |", per_sec * 32.0 * len as f64 / 1e9);
        }
        println!();
    }
    // attention-sized vectors (one head), where call overhead and tails matter
    for d in [64usize, 80, 128] {
        let keys = &data[..ROWS * d];
        let q = &data[ROWS * d..ROWS * d + d];
        print!("| dot f32 n={d} (Gdot/s) |");
        for k in &sets {
            let mut sink = 0f32;
            let per_sec = rate(secs, || {
                for r in 0..ROWS {
                    sink += (k.f32)(q, &keys[r * d..(r + 1) * d]);
                }
            });
            std::hint::black_box(sink);
            print!(" {:.3} |", per_sec * ROWS as f64 / 1e9);
        }
        println!();
        let mut out = vec![0f32; d];
        print!("| axpy n={d} (G/s) |");
        for k in &sets {
            let per_sec = rate(secs, || {
                for r in 0..ROWS {
                    (k.axpy)(0.01, &keys[r * d..(r + 1) * d], &mut out);
                }
            });
            print!(" {:.3} |", per_sec * ROWS as f64 / 1e9);
        }
        std::hint::black_box(&out);
        println!();
    }
}

/// Prefill GEMM: `Matrix::matmul` against the simplest alternative
/// (dequantize each row, then one dot per token), in GFLOP/s.
fn gemm(secs: f64, types: &[DType]) {
    let k = kvslim_kernels::dot::kernels();
    println!("matmul {N}x{N}, kernels {}, GFLOP/s (2·rows·cols·n / time)", k.isa);
    println!("| dtype | n | row dots 1T | matmul 1T | row dots 2T | matmul 2T |");
    println!("|---|---:|---:|---:|---:|---:|");
    let data = Lcg(5).vec(N * N);
    for &dt in types {
        let m = Matrix::quantized(dt, N, N, &data).unwrap();
        for n in [16usize, 64] {
            let x = &data[..n * N];
            let mut out = vec![0f32; n * N];
            let flops = 2.0 * (N * N * n) as f64;
            let mut line = format!("| {dt} | {n} |");
            for t in THREADS {
                let p = pool(t);
                let naive = p.install(|| {
                    rate(secs, || {
                        out.par_chunks_mut(n).enumerate().for_each(|(r, o)| {
                            let mut w = vec![0f32; N];
                            m.row_into(r, &mut w);
                            for (t, v) in o.iter_mut().enumerate() {
                                *v = (k.f32)(&w, &x[t * N..(t + 1) * N]);
                            }
                        })
                    })
                });
                let tiled = p.install(|| rate(secs, || m.matmul(x, n, &mut out)));
                line += &format!(" {:.1} | {:.1} |", naive * flops / 1e9, tiled * flops / 1e9);
            }
            println!("{line}");
        }
    }
}

/// Prefill- and decode-sized products at the weight shapes of SmolLM2-135M
/// (576×576 q/o projections, 1536×576 gate/up): `Matrix::matmul` over 512
/// tokens and `Matrix::matvec` (n = 1), with f32 products and, for the
/// formats that have them, integer products, in GFLOP/s (2·rows·cols·n /
/// time), best of five trials. K-quant rows are padded to 768 columns
/// (super-blocks of 256).
fn prefill(secs: f64, types: &[DType]) {
    use kvslim_kernels::Products;
    const TOKENS: usize = 512;
    const SHAPES: [(usize, usize); 2] = [(576, 576), (1536, 576)];
    let k = kvslim_kernels::dot::kernels();
    println!("matmul (n = {TOKENS}) and matvec (n = 1), kernels {}, GFLOP/s", k.isa);
    println!("| dtype | products | rows×cols | n | 1T | 2T |");
    println!("|---|---|---|---:|---:|---:|");
    let mut lcg = Lcg(7);
    let mut rnd = |len: usize| lcg.vec(len);
    for &dt in types {
        for products in [Products::F32, Products::Int8] {
            if products == Products::Int8 && Products::preferred(dt) != Products::Int8 {
                continue;
            }
            for (rows, cols) in SHAPES {
                // K-quants need whole 256-element super-blocks: 576 → 768
                let cols = cols.next_multiple_of(dt.block_elems());
                let m = Matrix::quantized_with(dt, rows, cols, &rnd(rows * cols), products).unwrap();
                let x = rnd(TOKENS * cols);
                let mut out = vec![0f32; TOKENS * rows];
                for n in [TOKENS, 1] {
                    let flops = 2.0 * (rows * cols * n) as f64;
                    let mut line = format!("| {dt} | {products:?} | {rows}×{cols} | {n} |");
                    for t in THREADS {
                        let r = pool(t).install(|| rate(secs, || m.matmul(&x[..n * cols], n, &mut out[..n * rows])));
                        line += &format!(" {:.1} |", r * flops / 1e9);
                    }
                    println!("{line}");
                }
            }
        }
    }
}

/// Microseconds per call of `f`, best of five trials of about `secs` each.
fn best_us(secs: f64, mut f: impl FnMut() -> f64) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let (start, mut calls, mut sink) = (Instant::now(), 0u32, 0.0);
        while calls == 0 || start.elapsed().as_secs_f64() < secs {
            sink += f();
            calls += 1;
        }
        std::hint::black_box(sink);
        best = best.min(start.elapsed().as_secs_f64() * 1e6 / calls as f64);
    }
    best
}

fn softmax(secs: f64) {
    use kvslim_kernels::ops::{kl_divergence, log_sum_exp};
    // the scalar f64 form these kernels replaced
    let libm_lse = |l: &[f32]| {
        let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        l.iter().map(|v| (*v as f64 - m).exp()).sum::<f64>().ln() + m
    };
    let libm_kl = |p: &[f32], q: &[f32]| {
        let (lp, lq) = (libm_lse(p), libm_lse(q));
        p.iter().zip(q).map(|(a, b)| (*a as f64 - lp).exp() * ((*a as f64 - lp) - (*b as f64 - lq))).sum::<f64>()
    };
    println!("vocab  op            libm µs  kernel µs  speed-up");
    for n in [49_152usize, 262_144] {
        let p: Vec<f32> =
            (0..n as u32).map(|i| ((i.wrapping_mul(2_654_435_761) >> 8) as f32 / 65536.0).sin() * 12.0 - 3.0).collect();
        let q: Vec<f32> = p.iter().enumerate().map(|(i, v)| v + ((i % 13) as f32 - 6.0) * 0.05).collect();
        let (a, b) = (best_us(secs, || libm_lse(&p)), best_us(secs, || log_sum_exp(&p)));
        println!("{n:>7}  log_sum_exp  {a:>8.1}  {b:>9.1}  {:>7.2}x", a / b);
        let (a, b) = (best_us(secs, || libm_kl(&p, &q)), best_us(secs, || kl_divergence(&p, &q)));
        println!("{n:>7}  kl_divergence{a:>8.1}  {b:>9.1}  {:>7.2}x", a / b);
    }
}

fn tiled(secs: f64) {
    use kvslim_kernels::attention::{
        attend_causal_tiled, pack_keys_tiled, TiledQueries, TiledRep, TiledScratch, TiledTarget,
    };
    const D: usize = 128;
    const HEADS: usize = 6;
    const BLOCK: usize = 16;
    println!(
        "tiled prefill attention, {BLOCK} queries at the prompt's end, {HEADS} heads over one KV head of {D}, 1 thread"
    );
    println!("| prompt | outputs ms | + column sums ms | ratio | column sums only ms |");
    println!("|---:|---:|---:|---:|---:|");
    let mut lcg = Lcg(11);
    for len in [4096usize, 16_384, 32_768, 65_536] {
        let (keys, values) = (lcg.vec(len * D), lcg.vec(len * D));
        let mut packed = Vec::new();
        pack_keys_tiled(&keys, D, &mut packed);
        let q = lcg.vec(BLOCK * HEADS * D).iter().map(|x| x * 8.0).collect::<Vec<_>>();
        let positions: Vec<u32> = (0..len as u32).collect();
        let reps: Vec<TiledRep> =
            (0..HEADS).map(|h| TiledRep { queries: &q[h * D..], q_stride: HEADS * D, packed_keys: &packed }).collect();
        let targets: Vec<TiledTarget> =
            (0..HEADS).map(|h| TiledTarget { rep: h, values: &values, out_offset: h * D }).collect();
        let queries = TiledQueries { pos0: (len - BLOCK) as u32, n: BLOCK, window: None };
        let mut out = vec![0f32; BLOCK * HEADS * D];
        let mut columns = vec![0f32; len];
        let mut scratch = TiledScratch::default();
        let sum = |p: &[f32], group: usize, sc: &mut [f32]| {
            for row in p.chunks_exact(sc.len()).take(group) {
                sc.iter_mut().zip(row).for_each(|(s, x)| *s += x);
            }
        };
        let mut run = |t: &[TiledTarget], cols: bool| {
            1e-3 * best_us(secs, || {
                let c = cols.then_some((&mut columns[..], &sum as _));
                attend_causal_tiled(&reps, t, &positions, queries, D, 0.088, &mut out, HEADS * D, c, &mut scratch);
                out[0] as f64
            })
        };
        let (plain, both, only) = (run(&targets, false), run(&targets, true), run(&[], true));
        println!("| {len} | {plain:.2} | {both:.2} | {:.2}x | {only:.2} |", both / plain);
    }
}
