//! Compile-time behaviour of `#[idempotent]`: what compiles (`ui/pass`,
//! `ui/pass-all-features`) and
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

/// Errors that depend on the enabled features (they list every backend, or
/// concern async handlers): pinned with every feature on.
#[test]
#[cfg_attr(
    not(all(feature = "postgres", feature = "mysql", feature = "async")),
    ignore = "tests/ui/fail-all-features pins errors that depend on every feature: cargo test --all-features"
)]
fn ui_with_every_feature() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass-all-features/*.rs");
    cases.compile_fail("tests/ui/fail-all-features/*.rs");
}

/// An `async fn` handler without the `async` feature.
#[test]
#[cfg_attr(
    feature = "async",
    ignore = "tests/ui/fail-default-features pins the error of a build without the `async` feature"
)]
fn ui_without_the_async_feature() {
    trybuild::TestCases::new().compile_fail("tests/ui/fail-default-features/*.rs");
}
