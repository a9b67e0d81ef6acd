//! What the crate's unit tests share.

/// Asserts that `parse` refuses every input of `cases` with an error that
/// contains the text paired with it.
pub(crate) fn assert_refused<T: std::fmt::Debug, E: std::fmt::Display>(
    parse: impl Fn(&str) -> Result<T, E>,
    cases: &[(&str, &str)],
) {
    for (input, want) in cases {
        let e = parse(input).unwrap_err().to_string();
        assert!(e.contains(want), "{input:?}: {e}");
    }
}
