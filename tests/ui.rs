//! Compile-time behaviour of `#[idempotent]`: what compiles (`ui/pass`) and
//! the error each mistake gets (`ui/fail`, pinned by `.stderr` files; after a
//! deliberate change, regenerate with `TRYBUILD=overwrite cargo test --test ui`
//! and review the diff).
#![cfg(feature = "sqlite")]

mod common;

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}

/// Errors whose text lists the supported backends, which depends on the
/// enabled features: pinned with every backend on.
#[test]
fn ui_with_every_backend() {
    if cfg!(all(feature = "postgres", feature = "mysql")) {
        trybuild::TestCases::new().compile_fail("tests/ui/fail-all-backends/*.rs");
    } else {
        common::skipped("tests/ui/fail-all-backends pin errors that list every backend; run with --all-features");
    }
}
