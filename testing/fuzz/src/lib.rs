//! A small structure-aware mutation fuzzer for the stable toolchain, shared
//! by the `fuzz_*` integration tests of several crates (a dev-dependency of
//! each). No coverage guidance: real seed files are mutated with byte-level
//! and field-level mutators, every input runs under
//! `catch_unwind`, a watchdog and an allocation check, and every failure is
//! reported with the case number that regenerates it.
//!
//! Knobs (environment):
//!
//! ```text
//! KVSLIM_FUZZ_ITERS  inputs per target (default: each target's quick count)
//! KVSLIM_FUZZ_SEED   base seed (default 0); case i uses mix(base, i)
//! KVSLIM_FUZZ_CASE   run only this one case number (to reproduce a report)
//! ```

use kvslim_cache::rng::SplitMix64;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ------------------------------------------------------------ allocation cap

/// Records the largest single allocation made by a thread that opted in,
/// so a target can assert that no input makes it reserve far more memory
/// than the input holds (e.g. `Vec::with_capacity(untrusted count)`).
/// Both the switch and the record are per thread: fuzz targets of one test
/// binary run in parallel, and one target's legitimate large allocation
/// must not count against another's input.
pub struct CountingAlloc;

thread_local! {
    static TRACK: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn note(size: usize) {
    if TRACK.try_with(|t| t.get()).unwrap_or(false) {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

// ------------------------------------------------------------------- knobs

/// Inputs per target: `KVSLIM_FUZZ_ITERS` or the target's quick default.
pub fn iters(quick: usize) -> usize {
    std::env::var("KVSLIM_FUZZ_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(quick)
}

fn base_seed() -> u64 {
    std::env::var("KVSLIM_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0)
}

fn only_case() -> Option<u64> {
    std::env::var("KVSLIM_FUZZ_CASE").ok().and_then(|s| s.parse().ok())
}

/// The generator of case `i` of target `name` (independent per case, so a
/// reported case number replays alone).
pub fn case_rng(name: &str, i: u64) -> SplitMix64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    let mut r = SplitMix64::new(h ^ base_seed().wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.rotate_left(32));
    r.next_u64();
    r
}

// ---------------------------------------------------------------- mutators

const BYTES: [u8; 7] = [0, 1, 0x7F, 0x80, 0xFF, b'"', b'0'];
const U32S: [u32; 9] = [0, 1, 2, 0x7F, 0xFFFF, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFE, u32::MAX];
const U64S: [u64; 10] = [0, 1, 2, 1 << 31, u32::MAX as u64, 1 << 32, 1 << 40, i64::MAX as u64, 1 << 63, u64::MAX];

/// A position: with probability 3/4 inside `focus` (the header), else anywhere.
fn pos(r: &mut SplitMix64, len: usize, focus: &std::ops::Range<usize>) -> usize {
    if len == 0 {
        return 0;
    }
    let end = focus.end.min(len);
    if focus.start < end && r.below(4) != 0 {
        focus.start + r.below(end - focus.start)
    } else {
        r.below(len)
    }
}

/// Applies 1 to 4 random byte-level mutations to `data` and returns what
/// was done (for the failure report).
pub fn mutate_bytes(r: &mut SplitMix64, data: &mut Vec<u8>, focus: std::ops::Range<usize>) -> String {
    let mut log = Vec::new();
    for _ in 0..1 + r.below(4) {
        let len = data.len();
        let p = pos(r, len, &focus);
        match r.below(10) {
            0 if len > 0 => {
                let bit = r.below(8);
                data[p.min(len - 1)] ^= 1 << bit;
                log.push(format!("flip bit {bit} @{p}"));
            }
            1 if len > 0 => {
                let v = BYTES[r.below(BYTES.len())];
                data[p.min(len - 1)] = v;
                log.push(format!("byte @{p} = {v:#x}"));
            }
            2 if len >= 4 => {
                let p = p.min(len - 4);
                let v = if r.below(4) == 0 { r.next_u64() as u32 & 0xFFFF } else { U32S[r.below(U32S.len())] };
                data[p..p + 4].copy_from_slice(&v.to_le_bytes());
                log.push(format!("u32 @{p} = {v:#x}"));
            }
            3 if len >= 8 => {
                let p = p.min(len - 8);
                let v = U64S[r.below(U64S.len())];
                data[p..p + 8].copy_from_slice(&v.to_le_bytes());
                log.push(format!("u64 @{p} = {v:#x}"));
            }
            4 => {
                data.truncate(p);
                log.push(format!("truncate to {p}"));
            }
            5 => {
                let n = 1 + r.below(64);
                let fill = if r.below(2) == 0 { 0 } else { r.next_u64() as u8 };
                data.extend(std::iter::repeat_n(fill, n));
                log.push(format!("extend by {n} x {fill:#x}"));
            }
            6 if len > 0 => {
                let a = p.min(len - 1);
                let n = 1 + r.below((len - a).min(256));
                let chunk = data[a..a + n].to_vec();
                let at = pos(r, len, &focus);
                data.splice(at..at, chunk);
                log.push(format!("duplicate {n} bytes from @{a} to @{at}"));
            }
            7 if len > 0 => {
                let a = p.min(len - 1);
                let n = 1 + r.below((len - a).min(256));
                data.drain(a..a + n);
                log.push(format!("delete {n} bytes @{a}"));
            }
            8 if len > 0 => {
                let v = r.next_u64() as u8;
                data[p.min(len - 1)] = v;
                log.push(format!("byte @{p} = {v:#x} (random)"));
            }
            _ if len >= 4 => {
                // a small signed/unsigned delta on a u32 field (off-by-one lengths)
                let p = p.min(len - 4);
                let old = u32::from_le_bytes(data[p..p + 4].try_into().unwrap());
                let d = r.below(17) as i64 - 8;
                let v = (old as i64 + d) as u32;
                data[p..p + 4].copy_from_slice(&v.to_le_bytes());
                log.push(format!("u32 @{p} {old:#x} -> {v:#x}"));
            }
            _ => log.push("noop".into()),
        }
    }
    log.join("; ")
}

/// Text mutations for grammars and JSON: the byte mutators plus splicing of
/// `dict` tokens (field names, keywords, boundary numbers). The result is
/// forced to UTF-8 (lossily) because the text parsers take `&str`.
pub fn mutate_text(r: &mut SplitMix64, text: &str, dict: &[&str]) -> (String, String) {
    const NUMS: [&str; 14] = [
        "0",
        "-1",
        "1",
        "-0",
        "1e308",
        "1e999",
        "NaN",
        "4294967296",
        "18446744073709551616",
        "9223372036854775807",
        "-9223372036854775808",
        "0.5",
        "100%",
        "1000000000000",
    ];
    let mut s = text.to_string();
    let mut log = Vec::new();
    for _ in 0..1 + r.below(3) {
        let b = s.as_bytes();
        let p = if b.is_empty() { 0 } else { r.below(b.len() + 1) };
        let p = (0..=p).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
        match r.below(6) {
            0 | 1 if !dict.is_empty() => {
                let t = dict[r.below(dict.len())];
                s.insert_str(p, t);
                log.push(format!("insert {t:?} @{p}"));
            }
            2 => {
                let t = NUMS[r.below(NUMS.len())];
                // replace a run of digits at/after p with the number
                let rest = &s[p..];
                let start = rest.find(|c: char| c.is_ascii_digit()).map(|i| p + i).unwrap_or(p);
                let end =
                    s[start..].find(|c: char| !c.is_ascii_digit() && c != '.').map(|i| start + i).unwrap_or(s.len());
                s.replace_range(start..end, t);
                log.push(format!("number @{start} = {t}"));
            }
            3 => {
                let end = (p + 1 + r.below(8)).min(s.len());
                let end = (end..=s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
                log.push(format!("delete {:?} @{p}", &s[p..end]));
                s.replace_range(p..end, "");
            }
            _ => {
                let mut bytes = s.into_bytes();
                let focus = 0..bytes.len();
                log.push(mutate_bytes(r, &mut bytes, focus));
                s = String::from_utf8_lossy(&bytes).into_owned();
            }
        }
    }
    (s, log.join("; "))
}

// ------------------------------------------------------------------ runner

/// Limits one input runs under.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Longest one input may run before it counts as a hang.
    pub per_input: Duration,
    /// Largest single allocation allowed, as `factor * input bytes + slack`.
    pub alloc_factor: usize,
    pub alloc_slack: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { per_input: Duration::from_secs(10), alloc_factor: 16, alloc_slack: 1 << 20 }
    }
}

/// What a target returns for one input: `Ok` (accepted) or the error
/// message (rejected), which must be a non-empty, readable sentence.
pub type Verdict = Result<(), String>;

/// Summary of one fuzz run.
#[derive(Debug, Default)]
pub struct Report {
    pub inputs: u64,
    pub accepted: u64,
    pub rejected: u64,
}

struct Progress {
    case: u64,
    started: Instant,
    what: String,
    done: bool,
}

/// Runs `n` cases of target `name`: `make(rng)` builds an input (bytes plus
/// a description of its mutations), `target(input)` parses it. Fails the
/// test on any panic, empty error message, hang or oversized allocation,
/// listing the failing cases (up to 10) with how to replay them.
pub fn run<I: Send + 'static>(
    name: &'static str,
    n: usize,
    limits: Limits,
    make: impl Fn(&mut SplitMix64) -> (I, usize, String) + Send + 'static,
    target: impl Fn(&I) -> Verdict + Send + 'static,
) -> Report {
    let progress =
        Arc::new(Mutex::new(Progress { case: 0, started: Instant::now(), what: String::new(), done: false }));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let (p2, f2) = (progress.clone(), failures.clone());
    let cases: Vec<u64> = match only_case() {
        Some(c) => vec![c],
        None => (0..n as u64).collect(),
    };
    let worker = std::thread::Builder::new()
        .name(format!("fuzz-{name}"))
        .spawn(move || {
            let mut rep = Report::default();
            for &i in &cases {
                let mut r = case_rng(name, i);
                let (input, size, what) = make(&mut r);
                {
                    let mut p = p2.lock().unwrap();
                    p.case = i;
                    p.started = Instant::now();
                    p.what = what.clone();
                }
                LARGEST.with(|l| l.set(0));
                TRACK.with(|t| t.set(true));
                let out = catch_unwind(AssertUnwindSafe(|| target(&input)));
                TRACK.with(|t| t.set(false));
                let largest = LARGEST.with(Cell::get);
                rep.inputs += 1;
                let fail = |why: String| {
                    f2.lock().unwrap().push(format!(
                        "{name} case {i} ({what}): {why}\n    replay: KVSLIM_FUZZ_SEED={} KVSLIM_FUZZ_CASE={i}",
                        base_seed()
                    ))
                };
                match out {
                    Ok(Ok(())) => rep.accepted += 1,
                    Ok(Err(e)) if e.trim().is_empty() => fail("rejected with an empty error message".into()),
                    Ok(Err(_)) => rep.rejected += 1,
                    Err(p) => fail(format!("PANIC: {}", panic_message(p.as_ref()))),
                }
                let cap = limits.alloc_factor.saturating_mul(size).saturating_add(limits.alloc_slack);
                if largest > cap {
                    fail(format!("allocated {largest} bytes at once for a {size}-byte input (cap {cap})"));
                }
                if f2.lock().unwrap().len() >= 10 {
                    break;
                }
            }
            p2.lock().unwrap().done = true;
            rep
        })
        .expect("spawn fuzz worker");
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let p = progress.lock().unwrap();
        if p.done {
            break;
        }
        if p.started.elapsed() > limits.per_input {
            panic!(
                "{name} case {} ({}) ran longer than {:?}: hang\n    replay: KVSLIM_FUZZ_SEED={} KVSLIM_FUZZ_CASE={}",
                p.case,
                p.what,
                limits.per_input,
                base_seed(),
                p.case
            );
        }
    }
    let rep = worker.join().expect("fuzz worker");
    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "{name}: {} failing input(s):\n{}", failures.len(), failures.join("\n"));
    eprintln!("fuzz {name}: {} inputs, {} accepted, {} rejected cleanly", rep.inputs, rep.accepted, rep.rejected);
    rep
}

/// `run` over seeds: each case picks a seed and `mutate(rng, seed)` makes
/// the input, its size in bytes and a description of its mutations.
pub fn run_seeded<S: Send + 'static, I: Send + 'static>(
    name: &'static str,
    n: usize,
    limits: Limits,
    seeds: Vec<S>,
    mutate: impl Fn(&mut SplitMix64, &S) -> (I, usize, String) + Send + 'static,
    target: impl Fn(&I) -> Verdict + Send + 'static,
) -> Report {
    assert!(!seeds.is_empty(), "{name}: no seeds");
    run(
        name,
        n,
        limits,
        move |r| {
            let k = r.below(seeds.len());
            let (input, size, what) = mutate(r, &seeds[k]);
            (input, size, format!("seed {k}: {what}"))
        },
        target,
    )
}

/// [`run_seeded`] over byte seeds, mutations biased to each seed's `focus`.
pub fn run_bytes(
    name: &'static str,
    n: usize,
    limits: Limits,
    seeds: Vec<(Vec<u8>, std::ops::Range<usize>)>,
    target: impl Fn(&[u8]) -> Verdict + Send + 'static,
) -> Report {
    let mutate = |r: &mut SplitMix64, (seed, focus): &(Vec<u8>, std::ops::Range<usize>)| {
        let mut data = seed.clone();
        let what = mutate_bytes(r, &mut data, focus.clone());
        let len = data.len();
        (data, len, what)
    };
    run_seeded(name, n, limits, seeds, mutate, move |d: &Vec<u8>| target(d))
}

/// [`run_seeded`] over text seeds with dictionary splicing.
pub fn run_text(
    name: &'static str,
    n: usize,
    limits: Limits,
    seeds: Vec<String>,
    dict: &'static [&'static str],
    target: impl Fn(&str) -> Verdict + Send + 'static,
) -> Report {
    let mutate = move |r: &mut SplitMix64, seed: &String| {
        let (s, what) = mutate_text(r, seed, dict);
        let len = s.len();
        (s, len, what)
    };
    run_seeded(name, n, limits, seeds, mutate, move |s: &String| target(s))
}

/// The message a panic was raised with (`panic!`'s formatted `String` or
/// literal `&str`; empty for any other payload).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
