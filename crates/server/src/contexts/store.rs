//! The contexts themselves: held in memory within the KV memory limit
//! (unused ones evicted least recently used first), saved to and loaded
//! from `--contexts-dir`, and found by id for the requests that ask them.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::scheduler::pools::{kv_bytes_for, Pools};
use crate::AppState;
use axum::http::StatusCode;
use kvslim_cache::store::paged::page_cap;
use kvslim_cache::PolicySpec;
use kvslim_engine::context::Context;
use kvslim_models::Model;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The file name of context `id` in a contexts directory.
fn file_name(id: &str) -> String {
    format!("{id}.kvctx")
}

/// Whether `id` is one this server could have made (`ctx-` + hex): ids
/// name files, so nothing else may reach the file system.
pub fn valid_id(id: &str) -> bool {
    id.strip_prefix("ctx-").is_some_and(|h| !h.is_empty() && h.len() <= 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A context held in memory.
struct Entry {
    id: String,
    ctx: Arc<Context>,
    /// K/V and metadata bytes reserved for it.
    bytes: usize,
    created: u64,
    /// Seconds its compression took (0 when loaded from a file).
    seconds: f64,
    /// Last use, in store ticks (LRU).
    used: u64,
}

/// What `GET /v1/contexts` reports of one context.
fn info(e: &Entry) -> Value {
    json!({
        "id": e.id,
        "object": "context",
        "tokens": e.ctx.tokens().len(),
        "policy": e.ctx.policy().to_string(),
        "kv_bytes": e.ctx.kv_bytes().kv,
        "kv_bytes_full": e.ctx.kv_bytes_full(),
        "reserved_bytes": e.bytes,
        "created": e.created,
        "seconds": e.seconds,
        "in_memory": true,
        "in_use": Arc::strong_count(&e.ctx) - 1,
    })
}

#[derive(Default)]
struct Inner {
    entries: Vec<Entry>,
    tick: u64,
}

/// The server's contexts (shared by the HTTP handlers and the scheduler).
#[derive(Clone, Default)]
pub struct ContextStore {
    inner: Arc<Mutex<Inner>>,
    dir: Option<PathBuf>,
}

/// Why a context could not be stored.
#[derive(Debug)]
pub enum StoreError {
    /// Its bytes do not fit the KV memory even after evicting every unused context.
    Memory(usize),
    Io(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Memory(b) => write!(
                f,
                "the context needs {b} bytes of KV memory, more than is free after evicting every unused context"
            ),
            StoreError::Io(e) => f.write_str(e),
        }
    }
}

impl ContextStore {
    /// A store keeping its files in `dir` (which must exist).
    pub fn new(dir: Option<PathBuf>) -> Self {
        ContextStore { inner: Arc::default(), dir }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves `bytes` of KV memory, evicting unused contexts (least
    /// recently used first) until they fit. Used by new contexts and by
    /// the scheduler's admission.
    pub fn reserve(&self, m: &Metrics, limit: usize, bytes: usize) -> bool {
        loop {
            if m.try_reserve_kv(bytes, limit) {
                return true;
            }
            let mut inner = self.lock();
            let victim = inner
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| Arc::strong_count(&e.ctx) == 1)
                .min_by_key(|(_, e)| e.used)
                .map(|(i, _)| i);
            let Some(i) = victim else { return false };
            let e = inner.entries.remove(i);
            m.kv_bytes_in_use.fetch_sub(e.bytes, Relaxed);
            m.contexts_evicted_total.fetch_add(1, Relaxed);
            drop(inner);
            self.refresh(m);
        }
    }

    /// Stores a new context under `id` (saving it to the directory first,
    /// when there is one), its bytes reserved.
    pub fn insert(
        &self,
        m: &Metrics,
        limit: usize,
        id: String,
        ctx: Context,
        seconds: f64,
    ) -> Result<Value, StoreError> {
        if let Some(d) = &self.dir {
            ctx.save(&d.join(file_name(&id))).map_err(|e| StoreError::Io(e.to_string()))?;
        }
        self.hold(m, limit, id, ctx, seconds)
    }

    fn hold(&self, m: &Metrics, limit: usize, id: String, ctx: Context, seconds: f64) -> Result<Value, StoreError> {
        let b = ctx.kv_bytes();
        let bytes = b.kv + b.metadata;
        if !self.reserve(m, limit, bytes) {
            return Err(StoreError::Memory(bytes));
        }
        let mut inner = self.lock();
        inner.tick += 1;
        let e = Entry { id, ctx: Arc::new(ctx), bytes, created: crate::now(), seconds, used: inner.tick };
        let v = info(&e);
        // the same id loaded twice at once (two requests for a context on
        // disk): the later copy replaces the earlier and frees its bytes
        if let Some(i) = inner.entries.iter().position(|x| x.id == e.id) {
            let old = inner.entries.remove(i);
            m.kv_bytes_in_use.fetch_sub(old.bytes, Relaxed);
        }
        inner.entries.push(e);
        drop(inner);
        self.refresh(m);
        Ok(v)
    }

    /// The context `id`, from memory or else (with a directory) from its
    /// file; `Ok(None)` when there is none.
    pub fn get(
        &self,
        model: &Model,
        pools: &Pools,
        (m, limit, page): (&Metrics, usize, usize),
        id: &str,
    ) -> Result<Option<Arc<Context>>, String> {
        {
            let mut inner = self.lock();
            inner.tick += 1;
            let tick = inner.tick;
            if let Some(e) = inner.entries.iter_mut().find(|e| e.id == id) {
                e.used = tick;
                return Ok(Some(e.ctx.clone()));
            }
        }
        let Some(dir) = &self.dir else { return Ok(None) };
        if !valid_id(id) {
            return Ok(None);
        }
        let path = dir.join(file_name(id));
        let Ok(bytes) = std::fs::read(&path) else { return Ok(None) };
        let ctx = load(model, pools, page, &bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        self.hold(m, limit, id.to_string(), ctx, 0.0).map_err(|e| e.to_string())?;
        Ok(self.lock().entries.iter().find(|e| e.id == id).map(|e| e.ctx.clone()))
    }

    /// Every context: those in memory, then those only on disk.
    pub fn list(&self) -> Vec<Value> {
        let inner = self.lock();
        let mut out: Vec<Value> = inner.entries.iter().map(info).collect();
        for id in self.files() {
            if !inner.entries.iter().any(|e| e.id == id) {
                out.push(json!({ "id": id, "object": "context", "in_memory": false }));
            }
        }
        out
    }

    /// One context's report (loaded from disk if needed).
    pub fn describe(&self, id: &str) -> Option<Value> {
        let inner = self.lock();
        if let Some(e) = inner.entries.iter().find(|e| e.id == id) {
            return Some(info(e));
        }
        self.files().contains(&id.to_string()).then(|| json!({ "id": id, "object": "context", "in_memory": false }))
    }

    /// Forgets `id` (memory and file); whether it existed.
    pub fn remove(&self, m: &Metrics, id: &str) -> bool {
        let mut found = false;
        {
            let mut inner = self.lock();
            if let Some(i) = inner.entries.iter().position(|e| e.id == id) {
                let e = inner.entries.remove(i);
                m.kv_bytes_in_use.fetch_sub(e.bytes, Relaxed);
                found = true;
            }
        }
        if let (Some(d), true) = (&self.dir, valid_id(id)) {
            found |= std::fs::remove_file(d.join(file_name(id))).is_ok();
        }
        self.refresh(m);
        found
    }

    /// Ids of the context files in the directory.
    fn files(&self) -> Vec<String> {
        let Some(d) = &self.dir else { return Vec::new() };
        let Ok(rd) = std::fs::read_dir(d) else { return Vec::new() };
        let mut ids: Vec<String> = rd
            .flatten()
            .filter_map(|f| f.file_name().to_str()?.strip_suffix(".kvctx").map(String::from))
            .filter(|id| valid_id(id))
            .collect();
        ids.sort();
        ids
    }

    /// Loads the directory's contexts at start-up while memory allows (the
    /// rest stay on disk, loaded on demand); each bad file is reported on
    /// stderr by name and skipped. Returns (loaded, refused).
    pub fn load_dir(&self, model: &Model, pools: &Pools, m: &Metrics, limit: usize, page: usize) -> (usize, usize) {
        let (mut loaded, mut refused) = (0, 0);
        let Some(dir) = self.dir.clone() else { return (0, 0) };
        for id in self.files() {
            let path = dir.join(file_name(&id));
            let result = std::fs::read(&path).map_err(|e| e.to_string()).and_then(|b| load(model, pools, page, &b));
            match result {
                Ok(ctx) => match self.hold(m, limit, id, ctx, 0.0) {
                    Ok(_) => loaded += 1,
                    Err(StoreError::Memory(_)) => break,
                    Err(e) => eprintln!("kvslim serve: context file {} not loaded: {e}", path.display()),
                },
                Err(e) => {
                    refused += 1;
                    eprintln!("kvslim serve: context file {} refused: {e}", path.display());
                }
            }
        }
        (loaded, refused)
    }

    /// Refreshes the context gauges.
    fn refresh(&self, m: &Metrics) {
        let inner = self.lock();
        m.contexts.store(inner.entries.len(), Relaxed);
        m.context_bytes.store(inner.entries.iter().map(|e| e.bytes).sum(), Relaxed);
    }
}

/// A context file's bytes as a context in the server's pools.
fn load(model: &Model, pools: &Pools, page: usize, bytes: &[u8]) -> Result<Context, String> {
    let head_dim = model.config.head_dim;
    let pool_for = |spec: &mut PolicySpec| {
        if page > 0 && spec.storage.page_size.is_none() {
            spec.storage.page_size = Some(page);
        }
        spec.storage.page_size.map(|p| pools.get(p, spec.storage.kv_dtype, head_dim))
    };
    Context::from_bytes_in(model, bytes, Some(&pool_for)).map_err(|e| e.to_string())
}

/// KV bytes a question on `ctx` reserves for `tail` more tokens (question
/// and answer): on a paged context only its own pages (the context's are
/// shared), `tail / page + 1` per head, plus its positions and scores;
/// the whole cache when the context is not paged (a fork copies it) or
/// when the tail could reach a head's page cap (a repack then copies the
/// context's pages).
pub fn fork_bytes(model: &Model, ctx: &Context, tail: usize) -> Result<usize, kvslim_cache::CacheError> {
    let policy = ctx.policy();
    let store = ctx.cache().store();
    let whole = || kv_bytes_for(model, policy, ctx.tokens().len(), tail);
    let Some(page) = policy.storage.page_size else { return whole() };
    let head = store.head(0, 0);
    let kept = (0..store.layers()).flat_map(|l| store.layer(l).iter().map(|h| h.len())).max().unwrap_or(0);
    let held = kept.div_ceil(page);
    let extra = tail.div_ceil(page) + 1;
    let cap = page_cap(head.capacity().max(kept), page);
    if held + extra > cap {
        return whole();
    }
    let row = head.dtype().row_bytes(head.head_dim());
    let per_head = extra * page * 2 * row + (kept + tail) * 8;
    Ok(store.layers() * store.kv_heads() * per_head)
}

/// What the scheduler does with a request that makes a context.
pub struct CompressJob {
    pub id: String,
    /// The context's meta (its framing).
    pub meta: Value,
    pub store: ContextStore,
    pub started: Instant,
}

/// The 404 of a context id that names none.
pub(crate) fn not_found(id: &str) -> ApiError {
    ApiError { status: StatusCode::NOT_FOUND, ..ApiError::bad(format!("no context `{id}`"), Some("context")) }
        .code("context_not_found")
}

/// The context a completion names (404 when there is none).
pub(crate) fn lookup(st: &AppState, id: &str) -> Result<Arc<Context>, ApiError> {
    let l = &st.scheduler.limits;
    let found = st
        .scheduler
        .contexts
        .get(&st.model, &st.scheduler.pools, (&st.scheduler.metrics, l.kv_memory, l.kv_page_size), id)
        .map_err(|e| ApiError::bad(format!("context `{id}` cannot be loaded: {e}"), Some("context")))?;
    found.ok_or_else(|| not_found(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserving_past_the_limit_fails_when_no_context_can_give_way() {
        let (store, m) = (ContextStore::new(None), Metrics::default());
        assert!(store.reserve(&m, 1000, 600));
        assert!(!store.reserve(&m, 1000, 600), "nothing to evict");
        assert_eq!(m.kv_bytes_in_use.load(Relaxed), 600);
        assert_eq!(m.contexts_evicted_total.load(Relaxed), 0);
        assert!(store.list().is_empty() && store.describe("ctx-00").is_none());
    }

    #[test]
    fn an_unknown_context_is_a_404_naming_it() {
        let e = not_found("ctx-12");
        assert_eq!((e.status, e.code), (StatusCode::NOT_FOUND, Some("context_not_found")));
        assert!(e.message.contains("ctx-12"));
    }
}
