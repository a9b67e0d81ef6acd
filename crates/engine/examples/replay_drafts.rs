//! The n-gram drafter replayed on a recorded greedy answer, without the
//! model: tokens per pass for fixed and adaptive draft lengths, and with a
//! model file (for its tokenizer) every pass that rejected a draft.
//!   kvslim generate … --temperature 0 --json > answer.json
//!   cargo run --release -p kvslim-engine --example replay_drafts -- answer.json [MODEL]
//! An answer that ended at the stop token counts one pass fewer here than
//! in the run (the pass whose target token was the stop token).
use kvslim_engine::{replay_drafts, DraftLength, NgramDrafter};
use kvslim_models::load_model;

fn ids(v: &serde_json::Value, key: &str) -> Vec<u32> {
    let list = v[key].as_array().unwrap_or_else(|| panic!("`{key}` missing: not `generate --json` output"));
    list.iter().map(|t| t.as_u64().expect("token id") as u32).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: replay_drafts GENERATE_JSON [MODEL]");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("JSON");
    let (prompt, answer) = (ids(&v, "prompt_token_ids"), ids(&v, "token_ids"));
    println!("| draft length | passes | drafted | accepted | tokens per pass |");
    println!("|---|---:|---:|---:|---:|");
    for k in [DraftLength::Fixed(2), DraftLength::Fixed(4), DraftLength::Fixed(8), DraftLength::default()] {
        let s = replay_drafts(&mut NgramDrafter::default(), &prompt, &answer, k, |_, _, _| {}).expect("replay");
        println!("| {k:?} | {} | {} | {} | {:.2} |", s.target_passes, s.drafted, s.accepted, s.tokens_per_pass());
    }
    let Some(model) = args.get(2) else { return };
    let tok = load_model(std::path::Path::new(model)).expect("model").tokenizer.expect("the model has a tokenizer");
    let text = |t: &[u32]| format!("{:?}", tok.decode(t).unwrap_or_default());
    println!("\npasses that rejected a draft (adaptive length): committed text | drafts | accepted");
    replay_drafts(&mut NgramDrafter::default(), &prompt, &answer, DraftLength::default(), |done, drafts, accepted| {
        if accepted < drafts.len() || drafts.is_empty() {
            let from = done.saturating_sub(6);
            println!("{:>4} …{} | {} | {accepted}", done, text(&answer[from..done]), text(drafts));
        }
    })
    .expect("replay");
}
