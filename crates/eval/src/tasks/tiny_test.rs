//! A task kind made in one file and registered with one line in
//! [`super::KINDS`], as `docs/contributing.md` says a new kind is: greedy
//! continuations of fixed story openings (`tiny_story[:max_tokens=N]`),
//! scored by `words` (mean words written). Its test runs it through the
//! matrix on stories260K.

use super::kind::{positive, set_option, GenerationItems, Kind, KvPeak, Prepared, Task};
use crate::cell::Cell;
use crate::error::Result;
use kvslim_models::{Model, Tokenizer};

pub const KIND: Kind = Kind {
    names: &["tiny_story"],
    file: false,
    extensions: &[],
    options: "max_tokens, limit",
    headline: &["words"],
    new: |_, _| Box::new(TinyStory { max_tokens: 8 }),
};

const OPENINGS: [&str; 3] =
    ["Once upon a time, there was a", "Lily and Ben went to the park. They", "The cat saw a big"];

#[derive(Clone, Debug, PartialEq)]
struct TinyStory {
    max_tokens: usize,
}

impl Task for TinyStory {
    fn name(&self) -> &'static str {
        "tiny_story"
    }

    fn set(&mut self, key: &str, vals: &[&str]) -> Result<bool, String> {
        set_option(&mut self.max_tokens, key, "max_tokens", vals, positive)
    }

    fn render(&self, _: bool) -> String {
        match self.max_tokens {
            8 => "tiny_story".into(),
            n => format!("tiny_story:max_tokens={n}"),
        }
    }

    fn prepare(&self, _: &Model, tok: &Tokenizer, limit: Option<usize>) -> Result<Box<dyn Prepared>> {
        let n = limit.unwrap_or(usize::MAX);
        let ids = OPENINGS.iter().take(n).map(|s| Ok(tok.encode(s)?)).collect::<Result<_>>()?;
        Ok(Box::new(Openings { ids, max_tokens: self.max_tokens }))
    }
}

struct Openings {
    ids: Vec<Vec<u32>>,
    max_tokens: usize,
}

impl Prepared for Openings {
    fn items(&self) -> usize {
        self.ids.len()
    }

    fn generation(&self) -> Option<GenerationItems<'_>> {
        Some((self.ids.iter().map(|p| (&p[..], &[][..])).collect(), self.max_tokens, false))
    }

    fn run(&mut self, cell: &mut Cell<'_>) -> Result<KvPeak> {
        let gens = cell.generations(self.generation().expect("a generation task"))?;
        let mut peak = KvPeak::default();
        let mut words = Vec::new();
        for g in gens.iter().map(|g| &g[0]) {
            peak.see(g.kv_bytes.kv, g.kv_bytes.metadata);
            words.push(cell.tok.decode(&g.token_ids)?.split_whitespace().count() as f64);
        }
        cell.row.per_item_mean("words", words);
        Ok(peak)
    }
}

#[test]
fn a_kind_in_one_file_runs_through_the_matrix() {
    use crate::{run_matrix, MatrixConfig, TaskSpec};
    let m = kvslim_models::load_model(&super::shared_dir::shared().join("models/stories260K/stories260K.bin")).unwrap();
    let e = TaskSpec::parse("tiny_story:seq_len=4").unwrap_err().to_string();
    assert!(e.contains("unknown option `seq_len` for `tiny_story` (allowed: max_tokens, limit)"), "{e}");
    let task = TaskSpec::parse("tiny_story:max_tokens=6,limit=2").unwrap();
    assert_eq!(TaskSpec::parse(&task.to_string()).unwrap(), task);
    let dir = std::env::temp_dir().join(format!("kvslim-eval-tiny-story-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = MatrixConfig::new("stories260K", vec![task]);
    cfg.policies = ["full", "h2o", "window"].map(String::from).to_vec();
    cfg.budgets = vec!["50%".into()];
    cfg.out_dir = Some(dir.clone());
    cfg.charts = false;
    let rows = run_matrix(&m.model, m.tokenizer.as_ref().unwrap(), &cfg, |_| {}).unwrap();
    assert_eq!(rows.len(), 3);
    for r in &rows {
        assert_eq!((r.key.task.as_str(), r.items), ("tiny_story:max_tokens=6,limit=2", 2), "{r:?}");
        assert!(r.metrics["words"] > 0.0 && r.per_item["words"].len() == 2, "{r:?}");
        // the three cells shared each opening's prefill
        assert_eq!(r.timings["shared_cells"], 3.0, "{r:?}");
        assert!(r.kv_bytes > 0);
    }
    let md = std::fs::read_to_string(dir.join("results.md")).unwrap();
    assert!(md.contains("## tiny_story:max_tokens=6,limit=2 — words (stories260K, 2 items)"), "{md}");
    std::fs::remove_dir_all(&dir).unwrap();
}
