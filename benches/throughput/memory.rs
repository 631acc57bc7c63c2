//! `--memory`: does the examples' peak memory stay flat with 10× the
//! messages? Each run starts by resetting the peak (`5` into
//! `/proc/self/clear_refs`), reads `VmRSS`, runs, and reads `VmHWM`.

use crate::args::Args;
#[cfg(feature = "async")]
use crate::async_consumer;
use crate::bench::Target;
use crate::output::{provenance, write_output};
use crate::quickstart;

/// (example, its own message count, a run of it over N messages)
type Workload<'u> = (
    &'static str,
    u64,
    Box<dyn Fn(u64) -> Result<(), String> + 'u>,
);

/// A `/proc/self/status` field in KiB.
fn status(field: &str) -> Result<u64, String> {
    let text = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("--memory needs Linux's /proc/self/status: {e}"))?;
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or(format!("no {field} in /proc/self/status"))
}

/// (RSS before, peak RSS during) of `work`, in KiB.
fn peak(work: impl FnOnce() -> Result<(), String>) -> Result<(u64, u64), String> {
    std::fs::write("/proc/self/clear_refs", "5").map_err(|e| format!("resetting VmHWM: {e}"))?;
    let before = status("VmRSS")?;
    work()?;
    Ok((before, status("VmHWM")?))
}

pub fn run(targets: &[Target], args: &Args) -> Result<(), String> {
    // The examples' own counts; --smoke runs a tenth of them.
    let scale = if args.min_secs == 0.0 { 10 } else { 1 };
    let mut rows = Vec::new();
    for target in targets {
        // The quickstart's own database on SQLite is in memory.
        let url = if target.name == "sqlite" {
            ""
        } else {
            target.url.as_str()
        };
        #[cfg_attr(not(feature = "async"), allow(unused_mut))]
        let mut workloads: Vec<Workload<'_>> = vec![(
            "quickstart",
            1_000 / scale,
            Box::new(move |n| match quickstart::run_on(url, n) {
                Ok(true) => Ok(()),
                Ok(false) => Err("quickstart: balances not exact".into()),
                Err(e) => Err(format!("quickstart: {e}")),
            }),
        )];
        #[cfg(feature = "async")]
        workloads.push((
            "async_consumer",
            2_000 / scale,
            Box::new(move |n| {
                tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?
                    .block_on(async_consumer::run_on(url, n))
                    .map_err(|e| format!("async_consumer: {e}"))
            }),
        ));
        for (name, base, work) in &workloads {
            let mut peaks = Vec::new();
            for factor in [1, 10] {
                let messages = base * factor;
                let (before, hwm) = peak(|| work(messages))?;
                peaks.push(hwm);
                rows.push(format!(
                    "    {{\"backend\": \"{}\", \"example\": \"{name}\", \"messages\": {messages}, \"rss_before_kib\": {before}, \"vmhwm_kib\": {hwm}}}",
                    target.name
                ));
                println!(
                    "memory: {} {name} {messages} messages: RSS before {before} KiB, peak (VmHWM) {hwm} KiB",
                    target.label
                );
            }
            println!(
                "memory: {} {name}: peak at 10× / at 1× = {:.2} ({:+} KiB)",
                target.label,
                peaks[1] as f64 / peaks[0] as f64,
                peaks[1] as i64 - peaks[0] as i64
            );
        }
    }
    let dir = write_output(
        "memory.json",
        &format!(
            "{{\n{}  \"results\": [\n{}\n  ]\n}}\n",
            provenance(targets),
            rows.join(",\n")
        ),
    )?;
    println!("wrote {}/memory.json", dir.display());
    Ok(())
}
