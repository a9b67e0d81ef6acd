// Where the integration tests of every crate find `../shared` (models,
// fixtures, data): `$KVSLIM_SHARED`, or `shared/` beside the repository.
// Included by each crate's `tests/common/mod.rs` (tests cannot share a
// module across crates otherwise).

/// The shared models/fixtures/data folder.
pub fn shared() -> std::path::PathBuf {
    match std::env::var_os("KVSLIM_SHARED") {
        Some(p) => std::path::PathBuf::from(p),
        None => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    }
}
