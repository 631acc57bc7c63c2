//! Compile-time behaviour of `#[idempotent]`: what compiles (`ui/pass`) and
//! the error each mistake gets (`ui/fail`, pinned by `.stderr` files; after a
//! deliberate change, regenerate with `TRYBUILD=overwrite cargo test --test ui`
//! and review the diff).
#![cfg(feature = "sqlite")]

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}

/// Errors whose text lists the supported backends, which depends on the
/// enabled features: pinned with every backend on.
#[test]
#[cfg_attr(
    not(all(feature = "postgres", feature = "mysql")),
    ignore = "tests/ui/fail-all-backends pins errors that list every backend: cargo test --all-features"
)]
fn ui_with_every_backend() {
    trybuild::TestCases::new().compile_fail("tests/ui/fail-all-backends/*.rs");
}
