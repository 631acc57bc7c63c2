//! The README's quickstart is `examples/readme.rs`, and its
//! production-shaped consumer `examples/order_service.rs`, which the build
//! compiles and CI runs: each pair must stay the same.

/// The first rust block of the README's section `heading`.
fn first_rust_block(heading: &str) -> &'static str {
    let readme = include_str!("../README.md");
    let section = readme
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("a section {heading:?}"));
    section
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap_or_else(|| panic!("a rust block in {heading:?}"))
}

#[test]
fn the_readme_quickstart_is_the_example() {
    assert_eq!(
        first_rust_block("## Quickstart"),
        include_str!("../examples/readme.rs"),
        "README quickstart and examples/readme.rs differ"
    );
}

#[test]
fn the_readme_production_consumer_is_the_example() {
    assert_eq!(
        first_rust_block("## A production-shaped consumer"),
        include_str!("../examples/order_service.rs"),
        "README production-shaped consumer and examples/order_service.rs differ"
    );
}
