//! A prompt fed a few layers at a time (`Session::begin_feed` /
//! `feed_some`, what the server interleaves with other sequences' decode
//! steps) leaves the cache and the logits bit-identical to one
//! `Session::feed`, under every prefill kernel, streamed prefills, KVzip's
//! repeat probe and online CHAI's probe, for every slice size.

use kvslim_cache::PolicySpec;
use kvslim_engine::Session;
use kvslim_models::{LoadedModel, Logits};
mod common;

use common::{assert_same_cache, chai_plan, stories, tokens};

fn policies() -> Vec<String> {
    let plan = chai_plan("sliced", 8, &[2, 3, 4, 5, 6]);
    [
        "full",
        "full:kv_dtype=q8",
        "h2o:heavy=25%,recent=25%",
        "h2o:heavy=25%,recent=25%,prefill=snap:8",
        "h2o:heavy=20%,recent=20%,alloc=ada:0.2",
        "h2o:heavy=20%,recent=20%,sink=2,page=4",
        "h2o:heavy=25%,recent=25%,score=tova",
        "h2o:heavy=25%,recent=25%,prefill=kvzip",
        "h2o:heavy=20%,recent=20%,prefill=rkv",
        "h2o:heavy=8,recent=8,prefill=stream:16",
        "window:recent=20%",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("chai:plan={plan},probe=5"), format!("h2o:heavy=10,recent=10+chai:plan={plan}")])
    .collect()
}

fn session<'m>(m: &'m LoadedModel, spec: &str, n: usize) -> Session<'m> {
    let policy = PolicySpec::parse_and_load(spec).unwrap();
    Session::new(&m.model, &policy, n + 8, n).unwrap()
}

#[test]
fn a_prefill_run_in_slices_equals_one_feed() {
    let m = stories();
    let n_layers = m.model.config.n_layers;
    let prompt = tokens(&m, 150);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for spec in policies() {
        for want in [Logits::Last, Logits::All] {
            let mut whole = session(&m, &spec, prompt.len());
            let expected = bits(whole.feed(&prompt, want).unwrap());
            // one layer per slice, a few layers, and everything at once
            for budget in [1, 3 * prompt.len(), usize::MAX] {
                let what = format!("{spec}, {want:?}, budget {budget}");
                let mut sliced = session(&m, &spec, prompt.len());
                let mut feed = sliced.begin_feed(prompt.clone(), want);
                let (mut slices, mut total) = (0, 0);
                loop {
                    let (done, used) = sliced.feed_some(&mut feed, budget).unwrap();
                    slices += 1;
                    total += used;
                    assert!(used > 0 || done, "{what}: a slice ran nothing");
                    if done {
                        break;
                    }
                }
                assert_eq!(bits(sliced.fed_logits(&feed)), expected, "{what}: logits");
                assert_same_cache(&sliced.cache, &whole.cache, &what);
                assert_eq!(feed.tokens(), &prompt[..]);
                if budget == 1 {
                    // every layer of every chunk ran in a slice of its own
                    assert!(slices >= n_layers, "{what}: {slices} slices");
                    assert!(total >= n_layers * prompt.len(), "{what}: {total} token-layers");
                }
                if budget == usize::MAX {
                    assert_eq!(slices, 1, "{what}");
                }
            }
        }
    }
}

#[test]
fn a_cache_fed_in_the_middle_of_a_sliced_prefill_is_an_error() {
    let m = stories();
    let prompt = tokens(&m, 40);
    let mut s = session(&m, "full", prompt.len() + 4);
    let mut feed = s.begin_feed(prompt.clone(), Logits::Last);
    assert!(!s.feed_some(&mut feed, 1).unwrap().0);
    // the model's forward of other tokens moves the cache past the run's start
    let mut other = session(&m, "full", 4);
    other.feed(&prompt[..2], Logits::Last).unwrap();
    std::mem::swap(&mut s.cache, &mut other.cache);
    let err = s.feed_some(&mut feed, usize::MAX).unwrap_err();
    assert!(err.to_string().contains("was fed meanwhile"), "{err}");
}
