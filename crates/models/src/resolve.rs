//! Model specs: a local path, `hf:org/repo/file`, or a built-in alias.
