//! KVzip's repeat probe (`prefill=kvzip[:C]`): its rows are the
//! instructions and the repeated prompt, piece by piece, and the tiled
//! kernel scores as the query-by-query path. Its scores are checked
//! against the f64 reference in `policy_reference.rs`.

mod common;

use common::{stories, tokens};
use kvslim_cache::PolicySpec;
use kvslim_engine::Session;
use kvslim_models::{Logits, Trace};

/// The KVzip probe is the reconstruction instruction and the prompt
/// teacher-forced again: its rows' keys in every layer are those of a full
/// cache fed the prompt, the instruction ("Repeat the previous context
/// exactly.", as the loader tokenized it) and the prompt without its BOS,
/// and the probe never enters the cache.
#[test]
fn kvzip_probe_is_the_prompt_repeated() {
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let prompt = tok.encode("Tom had a red ball and a blue kite. He ran to the park").unwrap();
    assert_eq!(Some(prompt[0]), m.model.config.bos_token_id);
    let traced = |spec: &str, tokens: &[u32]| {
        let spec = PolicySpec::parse(spec).unwrap();
        let mut s = Session::new(&m.model, &spec, tokens.len(), tokens.len()).unwrap();
        s.scratch.trace = Some(Trace::default());
        s.feed(tokens, Logits::Last).unwrap();
        (s.scratch.trace.take().unwrap(), s.position(), s.cache.store().head(0, 0).positions().to_vec())
    };
    let (kvzip, at, kept) = traced("h2o:heavy=4,recent=4,prefill=kvzip", &prompt);
    assert!(!m.model.repeat_prompt.is_empty(), "the loader sets the instruction");
    assert_eq!(
        tok.decode(&m.model.repeat_prompt).unwrap(),
        kvslim_models::transformer::REPEAT_INSTRUCTION,
        "the instruction as text"
    );
    let mut repeated = prompt.clone();
    repeated.extend_from_slice(&m.model.repeat_prompt);
    repeated.extend_from_slice(&prompt[1..]);
    let (full, _, _) = traced("full", &repeated);
    let kvd = m.model.config.kv_dim();
    for (l, (a, b)) in kvzip.qkv.iter().zip(&full.qkv).enumerate() {
        assert_eq!(a[1].len(), repeated.len() * kvd, "layer {l}: prompt and probe rows");
        assert_eq!(a[1], b[1], "layer {l}: the probe's keys are the repeated prompt's");
    }
    assert_eq!(at, prompt.len(), "the probe does not advance the sequence");
    assert!(kept.iter().all(|&p| (p as usize) < prompt.len()), "kept {kept:?}: no repeat row stays");

    // in pieces of 4: each piece's rows are its instruction ("Repeat the
    // part …, starting with" and the previous piece's last tokens from the
    // second on) and its tokens, right after the prompt; layer 0's keys
    // depend only on tokens and positions
    let (pieces, _, _) = traced("h2o:heavy=4,recent=4,prefill=kvzip:4", &prompt);
    assert_eq!(
        tok.decode(&m.model.repeat_part_prompt).unwrap(),
        kvslim_models::transformer::REPEAT_PART_INSTRUCTION,
        "the later pieces' instruction as text"
    );
    let mut row = prompt.len();
    for start in (1..prompt.len()).step_by(4) {
        let mut fed = prompt.clone();
        match start {
            1 => fed.extend_from_slice(&m.model.repeat_prompt),
            _ => {
                fed.extend_from_slice(&m.model.repeat_part_prompt);
                fed.extend_from_slice(&prompt[start.saturating_sub(8).max(1)..start]);
            }
        }
        fed.extend_from_slice(&prompt[start..(start + 4).min(prompt.len())]);
        let (alone, _, _) = traced("full", &fed);
        let rows = fed.len() - prompt.len();
        assert_eq!(
            pieces.qkv[0][1][row * kvd..(row + rows) * kvd],
            alone.qkv[0][1][prompt.len() * kvd..],
            "the piece from prompt token {start}"
        );
        row += rows;
    }
    assert_eq!(row * kvd, pieces.qkv[0][1].len(), "the pieces are all the probe's rows");
}

/// The reconstruction instruction's rows attend but score nothing in the
/// tiled kernel too: with every prompt token kept, layer 0's KVzip scores
/// from the tiled kernel equal the query-by-query path's (which the f64
/// reference checks) to rounding, position by position, in one piece or
/// several.
#[test]
fn kvzip_instruction_scores_nothing_in_the_tiled_kernel() {
    let m = stories();
    let ids = tokens(&m, 60);
    for spec in ["h2o:heavy=200,recent=8,prefill=kvzip", "h2o:heavy=200,recent=8,prefill=kvzip:16"] {
        let spec = PolicySpec::parse(spec).unwrap();
        let scores = |trace: bool| {
            let mut s = Session::new(&m.model, &spec, ids.len(), ids.len()).unwrap();
            if trace {
                s.scratch.trace = Some(Trace::default());
            }
            s.feed(&ids, Logits::Last).unwrap();
            let h = s.cache.store().head(0, 0);
            let mut by_pos: Vec<(u32, f32)> = h.positions().iter().copied().zip(h.scores().iter().copied()).collect();
            by_pos.sort_by_key(|p| p.0);
            by_pos
        };
        let (tiled, traced) = (scores(false), scores(true));
        assert_eq!(tiled.len(), ids.len(), "every prompt token kept");
        for ((p, a), (_, b)) in tiled.iter().zip(&traced) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1e-3), "position {p}: tiled {a} vs query by query {b}");
        }
    }
}
