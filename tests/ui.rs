//! Compile-time behaviour of `#[idempotent]`: the error each mistake gets
//! (`ui/fail*`, pinned by `.stderr` files; after a deliberate change,
//! regenerate with `TRYBUILD=overwrite cargo test --test ui` and review the
//! diff), and what compiles and runs (`ui/pass*`).
//!
//! The cases that must compile are modules of this test binary, each
//! called by a test below, rather than trybuild `pass` cases: one of those
//! makes trybuild build (not just check) every dependency a second time,
//! which took most of the UI tests' time in CI.
#![cfg(feature = "sqlite")]

#[test]
fn ui() {
    trybuild::TestCases::new().compile_fail("tests/ui/fail/*.rs");
}

/// Errors that depend on the enabled features (they list every backend, or
/// concern async handlers): pinned with every feature on.
#[test]
#[cfg_attr(
    not(all(feature = "postgres", feature = "mysql", feature = "async")),
    ignore = "tests/ui/fail-all-features pins errors that depend on every feature: cargo test --all-features"
)]
fn ui_with_every_feature() {
    trybuild::TestCases::new().compile_fail("tests/ui/fail-all-features/*.rs");
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

/// What compiles and runs on SQLite: each module is one case, as a user's
/// crate would write it, and its `main` runs.
// A case's own `#![deny(warnings)]` holds inside it; its error variants'
// fields (read only through `Debug`) and its unused connections are what a
// user's crate has, and are not errors there; some handlers take `&Vec`
// on purpose.
#[path = "ui/pass"]
#[allow(dead_code, unused_variables, clippy::ptr_arg)]
mod pass {
    #[path = "fingerprints-results-attempts.rs"]
    mod fingerprints_results_attempts;
    #[path = "handler-shapes.rs"]
    mod handler_shapes;
    #[path = "inner-attributes.rs"]
    mod inner_attributes;
    #[path = "user-trait-named-classify.rs"]
    mod user_trait_named_classify;

    #[test]
    fn fingerprints_results_attempts() {
        fingerprints_results_attempts::main();
    }

    #[test]
    fn handler_shapes() {
        handler_shapes::main().expect("every handler shape runs");
    }

    #[test]
    fn inner_attributes() {
        inner_attributes::main();
    }

    #[test]
    fn user_trait_named_classify() {
        user_trait_named_classify::main();
    }
}

/// What compiles with every feature: async handlers, the broker glue, the
/// helpers on pooled connections. Compiling this binary is the check (they
/// need servers to run, and their `main`s only name them), so no test
/// calls them.
#[cfg(all(
    feature = "postgres",
    feature = "async",
    feature = "lapin",
    feature = "nats"
))]
#[path = "ui/pass-all-features"]
#[allow(dead_code, unused_variables)]
mod pass_all_features {
    #[path = "async-inner-attributes.rs"]
    mod async_inner_attributes;
    #[path = "broker-glue-takes-every-outcome.rs"]
    mod broker_glue_takes_every_outcome;
    #[path = "helpers-take-pooled-connections.rs"]
    mod helpers_take_pooled_connections;
}
