//! The KV reservation (`kvslim_cache::accounting`, what the server admits
//! requests by) against the bytes a sequence really allocates, for every
//! token policy × layout × KV dtype: it must bound the measured peak, and
//! stay within 1.5× of it (fixed slots: exact; pages: a head never holds
//! more than its page cap, max(m + 1, ⌊3m/2⌋) pages for m = ⌈C/P⌉, and a
//! run that fills its capacity holds at least m).
//!
//! stories260K, a 48-token prompt and 80 decoded tokens (teacher-forced).
//!
//! Budget allocators: `alloc=pyramid` reserves each layer at its own
//! capacity (as tight as plain H2O); `alloc=ada` reserves every head at
//! the most it can win (its share is decided after admission), so its
//! reservation bounds the peak but is not within 1.5× of a paged peak.

use kvslim_cache::accounting::reservation;
use kvslim_cache::PolicySpec;
use kvslim_engine::Session;
use kvslim_models::Logits;
mod common;

use common::{stories, tokens};

#[test]
fn reservation_bounds_the_measured_peak() {
    let m = stories();
    let ids = tokens(&m, 128);
    let (prompt, n) = (48, ids.len());
    let shape = m.model.cache_shape();
    let policies =
        ["full", "h2o:heavy=12,recent=12", "window:recent=20", "sink:sink=4,recent=16", "random:budget=24,recent=8"]
            .into_iter()
            .chain(["h2o:heavy=12,recent=12,alloc=pyramid", "h2o:heavy=12,recent=12,alloc=ada"]);
    let layouts = ["", "page=8", "page=8,compact=16", "page=8,page_score=max"];
    let mut checked = 0;
    for policy in policies {
        for layout in layouts {
            if policy == "full" && (layout.contains("page_score") || layout.contains("compact")) {
                continue; // full keeps every token: nothing to compact or evict by page
            }
            if policy.contains("alloc=ada") && layout.contains("page_score") {
                continue; // rejected by the grammar: ada evicts token by token within each share
            }
            if (policy.starts_with("window") || policy.starts_with("sink")) && layout.contains("page_score") {
                continue; // rejected by the grammar: they evict only the token leaving the window
            }
            for dtype in ["f32", "f16", "q8", "q4"] {
                let mut keys: Vec<String> = [layout, &format!("kv_dtype={dtype}")]
                    .iter()
                    .filter(|k| !k.is_empty())
                    .map(|k| k.to_string())
                    .collect();
                let text = if policy == "full" {
                    format!("full:{}", keys.join(","))
                } else {
                    keys.insert(0, policy.to_string());
                    keys.join(",")
                };
                let spec = PolicySpec::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                let r = reservation(&spec, &shape, n, prompt).unwrap();
                let mut s = Session::new(&m.model, &spec, n, prompt).unwrap();
                let paged = spec.storage.page_size.is_some();
                let measure = |s: &Session<'_>| {
                    let b = s.kv_bytes();
                    if paged {
                        b.kv
                    } else {
                        b.kv + b.metadata
                    }
                };
                s.feed(&ids[..prompt], Logits::Last).unwrap();
                let mut peak = measure(&s);
                for &t in &ids[prompt..] {
                    s.feed(&[t], Logits::Last).unwrap();
                    peak = peak.max(measure(&s));
                }
                if paged {
                    // what each head held at its fullest, inside steps too
                    peak = peak.max(s.cache.store().peak_kv_bytes());
                }
                let ratio = r.total() as f64 / peak as f64;
                assert!(r.total() >= peak, "{text}: reserved {} < peak {peak}", r.total());
                if !policy.contains("alloc=ada") {
                    assert!(ratio <= 1.5, "{text}: reserved {} is {ratio:.2}× the peak {peak}", r.total());
                }
                eprintln!("{text:48} reserved {:>8} peak {peak:>8} ratio {ratio:.2}", r.total());
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 64 + 16 + 12);
}
