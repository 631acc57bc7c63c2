use super::{Args, Target};

pub fn run(_: &[Target], _: &Args) -> Result<(), String> {
    println!("SKIPPED: --scale needs the postgres or mysql feature (cargo bench --all-features)");
    Ok(())
}
