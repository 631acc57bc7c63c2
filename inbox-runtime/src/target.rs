//! The `tracing` target of every span and event of the library.

/// The target of every span and event of the library: filter on it
/// (`RUST_LOG=info,diesel_inbox=warn`).
pub(crate) const TARGET: &str = "diesel_inbox";
