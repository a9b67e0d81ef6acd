//! Attention over the same slots in each store layout and KV dtype: the
//! per-slot cost of paging and decoding (medians of interleaved runs, so
//! load on the machine affects every case alike).
//! `cargo run --release -p kvslim-cache --example attend_layouts [GROUP]`
//! (GROUP = query heads per KV head, default 1 as in a decode step).

use kvslim_cache::{HeadSlots, KvDtype, StoreLayout};
use kvslim_kernels::attention::{attend_group, Visible};
use std::time::Instant;

fn main() {
    let g: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let (d, len) = (64, 2048);
    let q: Vec<f32> = (0..g * d).map(|i| (i as f32 * 0.37).sin()).collect();
    let (mut probs, mut out) = (vec![0f32; g * len], vec![0f32; g * d]);
    let mut cases: Vec<(Option<usize>, KvDtype, HeadSlots, Vec<f64>)> = Vec::new();
    for dtype in KvDtype::ALL {
        for page in [None, Some(1), Some(16)] {
            let layout = StoreLayout { page_size: page, kv_dtype: dtype };
            let positions: Vec<u32> = (0..len as u32).collect();
            let k: Vec<f32> = (0..len * d).map(|i| (i as f32 * 0.11).cos()).collect();
            cases.push((page, dtype, HeadSlots::from_rows(d, layout, &positions, &k, &k), Vec::new()));
        }
    }
    for _ in 0..200 {
        for (_, _, h, times) in cases.iter_mut() {
            let (keys, values) = (h.key_rows().unwrap(), h.value_rows());
            let t = Instant::now();
            attend_group(
                &q,
                &keys,
                &values,
                h.positions(),
                Visible::causal(len as u32),
                d,
                0.125,
                &mut probs,
                len,
                &mut out,
            );
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    println!("| layout | kv dtype | µs per group attention ({len} slots, d={d}, {g} heads) |");
    println!("|---|---|---|");
    for (page, dtype, _, mut times) in cases {
        times.sort_by(f64::total_cmp);
        let layout = page.map_or("fixed".to_string(), |p| format!("page={p}"));
        println!("| {layout} | {dtype} | {:.1} |", times[times.len() / 2]);
    }
}
