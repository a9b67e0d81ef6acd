//! The loaders on the real task files in `../shared/data`.

use kvslim_eval::tasks::{load_code_items, load_hellaswag, load_mc_jsonl, load_ppl_text, TaskSpec};

mod common;

use common::{data, stories};

#[test]
fn multiple_choice_files_load_with_their_item_counts() {
    for (rel, n, k) in [
        ("piqa/piqa_llmfoundry.jsonl", 1838, 2),
        ("copa/copa.jsonl", 100, 2),
        ("arc/arc_easy.jsonl", 2376, 4),
        ("arc/arc_challenge.jsonl", 1172, 0),
        ("boolq/boolq.jsonl", 3270, 2),
        ("hellaswag/hellaswag_small_llmfoundry.jsonl", 0, 4),
    ] {
        let p = data(rel);
        let items = load_mc_jsonl(&p, None).unwrap();
        if n > 0 {
            assert_eq!(items.len(), n, "{rel}");
        }
        for it in &items {
            assert!(it.gold < it.continuations.len(), "{rel}");
            assert!(!it.context.ends_with(' '), "{rel}: {:?}", it.context);
            if k > 0 {
                assert_eq!(it.continuations.len(), k, "{rel}");
            }
        }
    }
    let p = data("piqa/piqa_llmfoundry.jsonl");
    let piqa = load_mc_jsonl(&p, None).unwrap();
    assert_eq!(piqa[0].context, "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:");
    assert!(piqa[0].continuations[0].starts_with(" Provide the guinea pig"));
    let p = data("boolq/boolq.jsonl");
    let boolq = load_mc_jsonl(&p, None).unwrap();
    assert!(boolq[0].context.ends_with("?\nAnswer:"), "{:?}", &boolq[0].context);
    assert_eq!(boolq[0].continuations, [" no", " yes"]);
    let p = data("copa/copa.jsonl");
    let copa = load_mc_jsonl(&p, None).unwrap();
    assert_eq!(copa[0].context, "The man turned on the faucet, therefore");
    assert_eq!(copa[0].continuations[1], " water flowed from the spout.");
}

#[test]
fn hellaswag_bz2_has_10042_items() {
    let p = data("hellaswag/hellaswag_val_full.txt.bz2");
    let items = load_hellaswag(&p).unwrap();
    assert_eq!(items.len(), 10042);
    assert_eq!(items[0].context, "Roof shingle removal: A man is sitting on a roof. he");
    assert_eq!(items[0].gold, 3);
    assert_eq!(items[0].continuations[3], " starts pulling up roofing on a roof.");
    assert!(items.iter().all(|i| i.continuations.len() == 4 && i.gold < 4));
    // through the task spec, with a limit
    let spec = TaskSpec::parse(&format!("{},limit=5", p.display())).unwrap();
    assert_eq!((spec.kind_name(), spec.limit), ("hellaswag", Some(5)));
    let m = stories();
    assert_eq!(spec.kind.prepare(&m.model, m.tokenizer.as_ref().unwrap(), spec.limit).unwrap().items(), 5);
}

#[test]
fn wikitext_crlf_is_normalised() {
    let p = data("wikitext2/wiki.test.raw");
    let t = load_ppl_text(&p).unwrap();
    assert!(!t.text.contains('\r'));
    assert!(t.text.starts_with(" = Robert Boulter = \n"));
}

/// The LCC-style code-completion items: 117, each a file prefix ending at a
/// line boundary and a non-blank next line.
#[test]
fn code_completion_items_load() {
    let items = load_code_items(&data("code_completion/stdlib_lcc.jsonl")).unwrap();
    assert_eq!(items.len(), 117);
    assert!(items.iter().all(|it| it.context.ends_with('\n') && !it.answer.trim().is_empty()));
}
