//! Result files of an evaluation run, all in one directory:
//!
//! * `results.jsonl` — one [`ResultRow`] per finished cell (model × policy
//!   × budget × task), appended and flushed as soon as the cell ends, so a
//!   crash loses at most the cell in flight. A resumed run
//!   ([`ResultsLog::resume`]) reads it back, tolerating a truncated last
//!   line, and skips the cells it holds ([`CellKey`]).
//! * `results.csv` — every row, one metric per column ([`to_csv`]).
//! * `results.md` — per task and model, one table per headline metric:
//!   rows are policies, columns budgets ([`to_markdown`]).
//! * `partial.jsonl` — the scored items of the multiple-choice cell in
//!   flight, a block per line ([`PartialCell`]), so a resumed run continues
//!   that cell from its last finished block instead of its first item (a
//!   whole HellaSwag cell is most of an hour); removed when the cell's row
//!   is written.

mod journal;
mod log;
mod row;
mod summary;

pub use journal::{PartialCell, PartialGroup, Resumed, ResumedGroup};
pub use log::{finished_cells, finished_keys, parse_rows, read_rows, ReadRows, ResultsLog};
pub use row::{git_commit, CellKey, ResultRow};
pub use summary::{to_csv, to_markdown, write_summaries, write_summaries_noted};
