use super::*;

fn words(s: &str) -> usize {
    s.split_whitespace().count()
}

fn cfg(task: RulerTask) -> RulerConfig {
    RulerConfig { lengths: vec![100, 400], depths: vec![0.0, 0.5, 1.0], per_cell: 2, seed: 7, ..RulerConfig::new(task) }
}

#[test]
fn passkey_items_are_deterministic_and_fit_their_length() {
    let c = cfg(RulerTask::Passkey);
    let a = ruler_items(&c, &words);
    assert_eq!(a, ruler_items(&c, &words));
    assert_eq!(a.len(), 12);
    for it in &a {
        let key = &it.answers[0];
        assert_eq!((it.answers.len(), key.len()), (1, 5));
        assert!(key.bytes().all(|b| b.is_ascii_digit()));
        let n = words(&it.prompt);
        assert!(n <= it.target_len && n + 5 > it.target_len, "{n} vs {}", it.target_len);
        assert!(it.prompt.ends_with(QUESTION));
        assert_eq!(it.prompt.matches(key.as_str()).count(), 2);
    }
    let other = ruler_items(&RulerConfig { seed: 8, ..c.clone() }, &words);
    assert_ne!(a[0].answers, other[0].answers);
    // the needle moves with depth
    let pos = |it: &RulerItem| it.prompt.find(&it.answers[0]).unwrap() as f64 / it.prompt.len() as f64;
    assert!(pos(&a[6]) < 0.2 && (0.35..0.65).contains(&pos(&a[8])) && pos(&a[10]) > 0.85);
    // too short a target still makes a (bare) prompt
    let tiny = RulerConfig { lengths: vec![5], depths: vec![0.5], per_cell: 1, ..c };
    assert_eq!(ruler_items(&tiny, &words)[0].filler, 0);
}

#[test]
fn passkey_prompt_layout() {
    let p = passkey_prompt("12345", 2, 1.0);
    assert_eq!(
            p,
            format!("{HEADER} The grass is green. The sky is blue. The pass key is 12345. Remember it. 12345 is the pass key.\n{QUESTION}")
        );
}

#[test]
fn every_task_fits_its_length_and_holds_its_answers() {
    for task in RulerTask::ALL {
        // (cwe's bare list of 80 words is over 100 words long)
        let c = RulerConfig { lengths: vec![300, 400], ..cfg(task) };
        let items = ruler_items(&c, &words);
        assert_eq!(items, ruler_items(&c, &words), "{task:?} is deterministic");
        let depths = if task == RulerTask::CommonWords { 1 } else { 3 };
        assert_eq!(items.len(), 2 * depths * 2, "{task:?}");
        for it in &items {
            let n = words(&it.prompt);
            assert!(n <= it.target_len, "{task:?}: {n} words for {}", it.target_len);
            if it.target_len == 400 {
                assert!(it.filler > 10 && n + 30 > it.target_len, "{task:?}: {n} of {}", it.target_len);
            }
            let want = match task {
                RulerTask::Passkey | RulerTask::NiahSingle | RulerTask::NiahMultiKey => 1,
                RulerTask::NiahMultiValue | RulerTask::NiahMultiQuery => 4,
                RulerTask::VariableTracking => 5,
                RulerTask::CommonWords => 10,
            };
            assert_eq!(it.answers.len(), want, "{task:?}");
            assert_eq!(answers_found(&it.prompt, &it.answers), want, "{task:?}: every answer is in the prompt");
        }
        assert_ne!(items[0].answers, items[1].answers, "{task:?}: items of a cell differ");
    }
}

#[test]
fn needles_and_distractors_are_where_they_should_be() {
    let it = &ruler_items(&cfg(RulerTask::NiahMultiKey), &words)[8]; // 400 words, depth 0.5
    assert_eq!(it.depth, 0.5);
    assert_eq!(it.prompt.matches("One of the special magic numbers for").count(), 4);
    let asked = it.prompt.rsplit("What is the special magic number for ").next().unwrap().split(' ').next().unwrap();
    let needle = format!("for {asked} is: {}.", it.answers[0]);
    let at = it.prompt.find(&needle).unwrap() as f64 / it.prompt.len() as f64;
    assert!((0.4..0.6).contains(&at), "the asked needle sits at the depth: {at}");
    let mv = &ruler_items(&cfg(RulerTask::NiahMultiValue), &words)[6];
    assert!(mv.prompt.contains("What are all the special magic numbers for"));
    // variable tracking: a chain from the value through every name, in order
    let vt = &ruler_items(&cfg(RulerTask::VariableTracking), &words)[6];
    let first = vt.prompt.find(&format!("VAR {} = ", vt.answers[0])).unwrap();
    for w in vt.answers.windows(2) {
        let hop = vt.prompt.find(&format!("VAR {} = VAR {}.", w[1], w[0])).expect("hop");
        assert!(hop > first);
    }
    // cwe: the ten answers eight times each, every other word three times
    let cw = &ruler_items(&cfg(RulerTask::CommonWords), &words)[2];
    let list = cw.prompt.split('\n').nth(1).unwrap();
    let mut counts = std::collections::HashMap::<&str, usize>::new();
    for w in list.split_whitespace().filter(|w| !w.ends_with('.')) {
        *counts.entry(w).or_default() += 1;
    }
    for a in &cw.answers {
        assert_eq!(counts[a.as_str()], 8, "{a}");
    }
    assert!(counts.iter().filter(|(w, _)| !cw.answers.iter().any(|a| a == *w)).all(|(_, &c)| c == 3));
}

#[test]
fn multiquery_asks_each_key_after_a_context_without_a_question() {
    for it in &ruler_items(&cfg(RulerTask::NiahMultiQuery), &words) {
        assert!(!it.prompt.contains("What is"), "the context asks nothing");
        assert!(it.prompt.ends_with('\n'));
        assert_eq!((it.questions.len(), it.answers.len()), (4, 4));
        for (q, a) in it.questions.iter().zip(&it.answers) {
            let key = q.strip_prefix("What is the special magic number for ").unwrap().split(' ').next().unwrap();
            assert!(it.prompt.contains(&format!("for {key} is: {a}.")), "question {q} expects {a}");
        }
    }
    // the other tasks ask in the prompt
    assert!(ruler_items(&cfg(RulerTask::NiahMultiKey), &words).iter().all(|it| it.questions.is_empty()));
}

#[test]
fn answers_match_whole_words_and_numbers() {
    let a = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(answers_found(" 48213. Remember", &a(&["48213"])), 1);
    assert_eq!(answers_found(" 482130", &a(&["48213"])), 0);
    assert_eq!(answers_found(" 4821", &a(&["48213"])), 0);
    assert_eq!(answers_found("1 48213 2", &a(&["48213"])), 1);
    assert_eq!(answers_found("They are: QWERT, ASDFG and zxcvb.", &a(&["QWERT", "ASDFG", "ZXCVB", "POIUY"])), 3);
    assert_eq!(answers_found("apples", &a(&["apple"])), 0);
}

/// FNV-1a over every item's prompt, answers, questions, filler, length
/// and depth.
fn digest(items: &[RulerItem]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes.iter().chain(&[0xff]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    };
    for it in items {
        eat(it.prompt.as_bytes());
        for a in it.answers.iter().chain(&it.questions) {
            eat(a.as_bytes());
        }
        eat(&(it.filler as u64).to_le_bytes());
        eat(&(it.target_len as u64).to_le_bytes());
        eat(&it.depth.to_bits().to_le_bytes());
    }
    h
}

#[test]
fn noise_items_are_the_ones_made_before_haystacks() {
    // digests of the items the code made before `haystack=` existed
    // (commit of this module without it), per task: lengths 300/400/1000
    // under a word counter, and the defaults under a bytes/4 counter
    let before = [
        (RulerTask::Passkey, 0x4c44f70ebab45d55, 0x411a05b2130a8266),
        (RulerTask::NiahSingle, 0x0f51707229bded61, 0x2a0422610a07ef20),
        (RulerTask::NiahMultiKey, 0x77a7f743bc20ac51, 0x522479271fb097c1),
        (RulerTask::NiahMultiValue, 0x6e6132adfc7530d3, 0xde861da2498d2d6a),
        (RulerTask::VariableTracking, 0x6a2bf7fe8354ba22, 0x16f5a685443a3f0e),
        (RulerTask::CommonWords, 0x595ad01de06cc004, 0xdbcd27a72674b04e),
        (RulerTask::NiahMultiQuery, 0xa8b2168f34d95826, 0x092be953e257d38c),
    ];
    let quarter = |s: &str| s.len() / 4 + 1;
    for (task, a, d) in before {
        let c = RulerConfig {
            lengths: vec![300, 400, 1000],
            depths: vec![0.0, 0.25, 0.5, 1.0],
            per_cell: 2,
            seed: 7,
            ..RulerConfig::new(task)
        };
        assert_eq!(c.haystack, Haystack::Noise, "noise is the default");
        assert_eq!(digest(&ruler_items(&c, &words)), a, "{task:?}");
        assert_eq!(digest(&ruler_items(&RulerConfig::new(task), &quarter)), d, "{task:?} (defaults)");
        let explicit = RulerConfig { haystack: Haystack::parse("noise").unwrap(), ..c.clone() };
        assert_eq!(ruler_items(&explicit, &words), ruler_items(&c, &words), "{task:?}: haystack=noise");
    }
}

const WIKI: &str = " = Robert Boulter = \n Robert Boulter is an English film , television and theatre actor . \
He had a guest @-@ starring role on the television series The Bill in 2000 . He was cast in Teddy 's Story , \
which was n't long ( about 1 @.@ 5 hours ) . \n\n = = Career = = \n In 2006 , Boulter starred in 1 @,@ 000 plays . \n \
Boulter did 12 % of the work ; \" Craig \" did the rest : all of it ! Then what ? Nothing.\n";

#[test]
fn text_becomes_paragraphs_of_sentences_without_long_numbers() {
    let t = HaystackText::from_text(WIKI);
    assert_eq!(
        t.sentences(),
        [
            "Robert Boulter is an English film, television and theatre actor.",
            "He was cast in Teddy's Story, which wasn't long (about 1.5 hours).",
            "Boulter did 12% of the work; \" Craig \" did the rest: all of it!",
            "Then what?",
            "Nothing.",
        ]
    );
    // the 2000 and 1,000 sentences are gone; the line of 1,000 with them
    assert_eq!((t.paragraphs(), &t.paragraphs[..]), (2, &[0, 2][..]));
    assert!(!has_digit_run("12 and 34 and 1.5", 3) && has_digit_run("in 1990s", 3) && has_digit_run("1,000", 3));
    // held out: whole lines within the first 45% of the bytes
    let text = "aaaa\nbbbb\ncccc\ndddd\n"; // 20 bytes: 45% is 9, the first line's end
    assert_eq!(&text[..held_out_end(text)], "aaaa\n");
    assert_eq!(held_out_end("one long line"), 0);
}

/// WikiText-2's test split, which the tests need (`../shared` or
/// `KVSLIM_SHARED`, as every crate's tests find it).
fn wikitext() -> HaystackText {
    let p = crate::tasks::shared_dir::shared().join(WIKITEXT_TEST);
    assert!(p.exists(), "{} is absent: the tests need ../shared (or KVSLIM_SHARED)", p.display());
    HaystackText::load(&p).unwrap()
}

/// Every run of 3 or more digits in `s`, sorted.
fn digit_runs(s: &str) -> Vec<&str> {
    let mut v: Vec<&str> = s.split(|c: char| !c.is_ascii_digit()).filter(|r| r.len() >= 3).collect();
    v.sort_unstable();
    v
}

#[test]
fn text_haystack_holds_the_noise_items_needles_once_at_their_depth() {
    let text = wikitext();
    assert!(text.sentences().len() > 2000 && text.paragraphs() > 500, "{}", text.sentences().len());
    // the whole pool is free of 3-digit runs and of the second half
    assert!(text.sentences().iter().all(|s| !has_digit_run(s, 3)));
    for task in RulerTask::ALL.into_iter().filter(|&t| t != RulerTask::CommonWords) {
        let c = RulerConfig { lengths: vec![400, 1500], ..cfg(task) };
        let items = ruler_items_in(&c, &text, &words);
        assert_eq!(items, ruler_items_in(&c, &text, &words), "{task:?} is deterministic");
        let noise = ruler_items(&c, &words);
        assert_eq!(items.len(), noise.len());
        for (it, nz) in items.iter().zip(&noise) {
            assert_eq!((&it.answers, &it.questions), (&nz.answers, &nz.questions), "{task:?}: the cell's needles");
            assert_ne!(it.prompt, nz.prompt);
            // the needles' numbers (and the question's), each as often as in
            // noise, and no other run of 3 or more digits
            assert_eq!(digit_runs(&it.prompt), digit_runs(&nz.prompt), "{task:?}");
            assert_eq!(answers_found(&it.prompt, &it.answers), it.answers.len(), "{task:?}");
            assert!(words(&it.prompt) <= it.target_len, "{task:?}");
            assert!(!it.prompt.contains("The grass is green"), "{task:?}");
        }
    }
    // the asked needle, once, at its depth in the filler
    let c = RulerConfig { lengths: vec![1500], depths: vec![0.0, 0.25, 0.5, 0.75, 1.0], ..cfg(RulerTask::NiahSingle) };
    for it in ruler_items_in(&c, &text, &words) {
        let needle = format!(" is: {}.", it.answers[0]);
        assert_eq!(it.prompt.matches(&needle).count(), 1);
        let (head, tail) = (NIAH_HEADER.len(), it.prompt.rfind("\nWhat is the special").unwrap());
        let at = (it.prompt.find(&needle).unwrap() - head) as f64 / (tail - head) as f64;
        assert!((at - it.depth).abs() < 0.03, "needle at {at:.3} for depth {}", it.depth);
        // between sentences: after the header or a sentence, before a space or line break
        let i = it.prompt.find(" One of the special magic numbers").unwrap();
        let before = &it.prompt[..i];
        assert!(i == head || text.sentences().iter().any(|s| before.ends_with(s.as_str())), "{before}");
        assert!(it.prompt[i + 1..].split_once(&needle).unwrap().1.starts_with([' ', '\n']));
    }
}

#[test]
fn text_items_fill_their_length_to_a_sentence_and_differ_by_seed() {
    let text = wikitext();
    for task in [RulerTask::Passkey, RulerTask::NiahMultiKey, RulerTask::VariableTracking] {
        let c = RulerConfig { lengths: vec![300, 2000], ..cfg(task) };
        for (len, _, draw, filler) in plan(&c, Some(&text)) {
            let n = fit_growing(&|n| draw.prompt(&filler, n), len, &words);
            let it = draw.prompt(&filler, n);
            assert!(words(&it) <= len && words(&draw.prompt(&filler, n + 1)) > len, "{task:?}: {n} sentences");
            assert!(n > 5, "{task:?}: {n}");
        }
        let (a, b) =
            (ruler_items_in(&c, &text, &words), ruler_items_in(&RulerConfig { seed: 8, ..c.clone() }, &text, &words));
        // each item starts at its own paragraph: seeds and the items of a cell differ
        let body = |it: &RulerItem| it.prompt.lines().nth(1).unwrap_or_default().to_string();
        assert!(a.iter().zip(&b).all(|(x, y)| body(x) != body(y)), "{task:?}");
        assert_ne!(body(&a[0]), body(&a[1]), "{task:?}");
    }
    // longer than the text: it wraps around
    let small = HaystackText::from_text("One. Two. Three.\nFour five. Six.\n");
    let c = RulerConfig { lengths: vec![200], depths: vec![0.5], per_cell: 1, ..cfg(RulerTask::Passkey) };
    let it = &ruler_items_in(&c, &small, &words)[0];
    assert!(it.filler > 40 && words(&it.prompt) <= 200 && it.prompt.matches("Four five.").count() > 5);
}

#[test]
fn text_haystack_files_and_errors() {
    assert_eq!(Haystack::parse("text").unwrap(), Haystack::Text(None));
    assert_eq!(Haystack::parse("text:/a/b.txt").unwrap(), Haystack::Text(Some("/a/b.txt".into())));
    assert_eq!(Haystack::parse("text:/a/b.txt").unwrap().render(true), "text:b.txt");
    let e = Haystack::parse("bogus").unwrap_err();
    assert!(e.contains("`haystack=bogus` is not a haystack (noise, text or text:FILE)"), "{e}");
    assert!(Haystack::parse("text:").unwrap_err().contains("needs a file"));
    // the default file is WikiText-2's test split from the shared folder
    let p = Haystack::Text(None).file().unwrap().unwrap();
    assert!(p.ends_with(WIKITEXT_TEST), "{}", p.display());
    assert_eq!(HaystackText::load(&p).unwrap(), wikitext());
    let missing =
        RulerConfig { haystack: Haystack::Text(Some("/no/such/essays.txt".into())), ..cfg(RulerTask::NiahSingle) };
    let e = try_ruler_items(&missing, &words).unwrap_err().to_string();
    assert!(e.contains("/no/such/essays.txt"), "{e}");
    // a file of numbers has no sentence to offer
    let dir = std::env::temp_dir().join(format!("kvslim-eval-haystack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("numbers.txt");
    std::fs::write(&f, "In 1999 it was 1000.\r\nIn 2000 it was 2000.\r\n".repeat(10)).unwrap();
    let e = HaystackText::load(&f).unwrap_err().to_string();
    assert!(e.contains("numbers.txt") && e.contains("no sentence"), "{e}");
    std::fs::write(&f, "A first line.\r\nA second line.\r\n".repeat(10)).unwrap();
    let own = RulerConfig { haystack: Haystack::Text(Some(f.clone())), ..cfg(RulerTask::NiahSingle) };
    let items = try_ruler_items(&own, &words).unwrap();
    assert!(items[4].prompt.contains("A second line.\nA first line.") && !items[4].prompt.contains('\r'));
    std::fs::remove_dir_all(&dir).unwrap();
}
