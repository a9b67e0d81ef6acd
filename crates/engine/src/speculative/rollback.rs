//! Undoing tentative tokens fed to a cache: a verification pass whose later
//! drafts were rejected, a draft model's own drafts.

use kvslim_cache::{CacheError, SequenceCache};

/// How tentative tokens fed to a cache are undone (the module docs of
/// [`super`] say when each applies).
pub(super) enum Rollback {
    /// Cut the cache back to `start` plus what is kept (nothing was or can
    /// be evicted).
    Cut { start: usize },
    /// The cache's undo journal ([`SequenceCache::checkpoint`]).
    Journal,
    /// A copy taken before (paged stores, CHAI).
    Snapshot(Box<SequenceCache>),
}

impl Rollback {
    /// The cheapest undo for `n` tokens about to be fed to `cache`.
    pub(super) fn before(cache: &mut SequenceCache, n: usize) -> Self {
        if cache.rewindable_after(n) {
            Rollback::Cut { start: cache.next_pos() }
        } else if cache.checkpoint() {
            Rollback::Journal
        } else {
            Rollback::Snapshot(Box::new(cache.clone()))
        }
    }

    /// Keeps the first `keep` of the `fed` tentative tokens, bit for bit
    /// as if only they had been fed. Returns true when the cache went back
    /// to before all of them instead (a snapshot, or a policy whose state
    /// moves with every step): the caller feeds the `keep` tokens again.
    pub(super) fn keep(self, cache: &mut SequenceCache, keep: usize, fed: usize) -> Result<bool, CacheError> {
        if keep == fed {
            if let Rollback::Journal = self {
                cache.commit();
            }
            return Ok(false);
        }
        match self {
            Rollback::Cut { start } => cache.truncate(start + keep).map(|_| false),
            Rollback::Journal if cache.rollback_to(keep) => Ok(false),
            Rollback::Journal => {
                cache.rollback();
                Ok(keep > 0)
            }
            Rollback::Snapshot(snapshot) => {
                *cache = *snapshot;
                Ok(keep > 0)
            }
        }
    }
}
