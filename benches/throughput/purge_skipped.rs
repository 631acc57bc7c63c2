use super::{Args, Target};

pub fn run(_: &[Target], _: &Args) -> Result<(), String> {
    println!("SKIPPED: --purge needs the postgres or mysql feature (cargo bench --all-features)");
    Ok(())
}
