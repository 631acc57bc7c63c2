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
