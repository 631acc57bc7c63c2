//! The README's quickstart is `examples/readme.rs`, which the build compiles
//! and CI runs: the two must stay the same.

#[test]
fn the_readme_quickstart_is_the_example() {
    let readme = include_str!("../README.md");
    let example = include_str!("../examples/readme.rs");
    let section = readme
        .split("## Quickstart")
        .nth(1)
        .expect("a Quickstart section");
    let code = section
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a rust block in the Quickstart section");
    assert_eq!(
        code, example,
        "README quickstart and examples/readme.rs differ"
    );
}
