//! `--scale`: `idempotent` messages/s with the inbox already holding each
//! of `--scale-rows` rows, on PostgreSQL and MySQL/MariaDB.
//!
//! Each size has a schema (PostgreSQL) or database (MySQL/MariaDB) of its
//! own, filled with random UUIDv4 text keys under the measured consumer
//! (`bench`), and the measured messages carry random UUIDv4 keys too: new
//! claims land all over the primary key's B-tree, as real message ids do.
//! Rounds alternate between the sizes (the order rotates each round); a
//! sample runs at least `--min-secs`. A size's ratio is the median of its
//! per-round ratios to the first size, with their interquartile range.

use crate::args::Args;
use crate::bench::{execute, Cell, KeySizes, Server, Target};
use crate::output::{print_cell, provenance, quantile, write_output};
use crate::run_id;
use std::fmt::Write as _;
use std::time::Instant;

/// Rows per fill statement (a transaction each). Each chunk is inserted in
/// key order: it sweeps the whole B-tree once, splitting pages as random
/// inserts do (the tree is not packed as a sorted bulk load would leave
/// it), without a random read per row. On MariaDB with its default 128 MiB
/// buffer pool, unsorted chunks took 3 minutes per million rows at 4M;
/// sorted ones 30 s.
const FILL_CHUNK: usize = 1_000_000;

pub fn run(targets: &[Target], args: &Args) -> Result<(), String> {
    crate::variants::UUID_KEYS.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut cells = Vec::new();
    let mut sizes = Vec::new();
    for target in targets {
        let Some((measure, _)) = target.server else {
            println!(
                "SKIPPED: --scale on {}: measured on PostgreSQL and MySQL/MariaDB",
                target.label
            );
            continue;
        };
        let (mut c, mut s) = measure(target, args)?;
        cells.append(&mut c);
        sizes.append(&mut s);
    }
    let dir = write_output(
        "scale.json",
        &to_json(&cells, &sizes, args, &provenance(targets)),
    )?;
    crate::output::draw_svg(&dir.join("scale.svg"), &cells).map_err(|e| format!("svg: {e}"))?;
    println!("wrote {}/scale.json and scale.svg", dir.display());
    Ok(())
}

/// One database per size, filled; then the interleaved rounds at each
/// thread count. Returns the cells (a sample list per size) and each
/// size's primary-key bytes.
pub fn measure<B: Server>(target: &Target, args: &Args) -> Result<(Vec<Cell>, KeySizes), String> {
    let mut databases: Vec<(i64, String, String)> = Vec::new();
    let result = (|| {
        for (i, &rows) in args.scale_rows.iter().enumerate() {
            let name = format!("inbox_bench_scale{i}_{}", run_id());
            let (url, drop_sql) = B::fresh(&target.url, &name)?;
            databases.push((rows, url.clone(), drop_sql));
            (target.setup)(&url)?;
            let began = Instant::now();
            let mut loaded = 0;
            while loaded < rows as usize {
                let chunk = FILL_CHUNK.min(rows as usize - loaded);
                execute::<B>(&url, &B::scale_fill(chunk)).map_err(|e| format!("fill: {e}"))?;
                loaded += chunk;
                if rows as usize > FILL_CHUNK {
                    println!(
                        "  {}: {loaded} of {rows} rows, {:.0}s",
                        target.label,
                        began.elapsed().as_secs_f64()
                    );
                }
            }
            execute::<B>(&url, B::ANALYZE)?;
            println!(
                "{}: {rows} random-key inbox rows loaded in {:.1}s",
                target.label,
                began.elapsed().as_secs_f64()
            );
        }
        let labels: Vec<&'static str> = databases
            .iter()
            .map(|(rows, _, _)| &*Box::leak(format!("{rows} rows").into_boxed_str()))
            .collect();
        let mut cells = Vec::new();
        for &threads in &args.threads {
            // Messages per sample, so that each lasts at least
            // --min-secs (an untimed run per size also warms it).
            let mut counts = Vec::new();
            for (rows, url, _) in &databases {
                let prefix = format!("{}c{threads}s{rows}", run_id());
                let rate = (target.measure)(
                    url,
                    "idempotent",
                    threads,
                    args.messages,
                    args.batch,
                    &prefix,
                )?;
                counts.push(crate::sample_size(rate, args, threads));
            }
            let mut cell = Cell {
                backend: target.name,
                label: target.label,
                mode: "scale",
                threads,
                samples: labels.iter().map(|l| (*l, Vec::new())).collect(),
            };
            for round in 0..args.rounds {
                for k in 0..databases.len() {
                    let i = (k + round) % databases.len();
                    let prefix = format!("{}r{round}t{threads}", run_id());
                    let mps = (target.measure)(
                        &databases[i].1,
                        "idempotent",
                        threads,
                        counts[i],
                        args.batch,
                        &prefix,
                    )?;
                    cell.samples[i].1.push(mps);
                }
            }
            print_cell(target.label, &cell, args);
            for (label, samples) in cell.samples.iter().skip(1) {
                let (median, q1, q3) = paired(&cell.samples[0].1, samples);
                println!(
                    "  {:<36}{median:>8.2} (IQR {q1:.2}–{q3:.2})",
                    format!("{label}/{}", cell.samples[0].0)
                );
            }
            cells.push(cell);
        }
        let mut sizes = Vec::new();
        for (rows, url, _) in &databases {
            let bytes = B::key_bytes(url)?;
            println!(
                "{}: {rows} rows: primary key {:.1} MiB",
                target.label,
                bytes as f64 / 1048576.0
            );
            sizes.push((target.name, *rows, bytes));
        }
        Ok((cells, sizes))
    })();
    for (_, _, drop_sql) in &databases {
        let _ = execute::<B>(&target.url, drop_sql);
    }
    result
}

/// Median and quartiles of the per-round ratios `samples[r] / base[r]`.
fn paired(base: &[f64], samples: &[f64]) -> (f64, f64, f64) {
    let ratios: Vec<f64> = samples
        .iter()
        .zip(base)
        .map(|(s, b)| s / b.max(1e-9))
        .collect();
    (
        quantile(&ratios, 0.5),
        quantile(&ratios, 0.25),
        quantile(&ratios, 0.75),
    )
}

fn to_json(cells: &[Cell], sizes: &[(&str, i64, i64)], args: &Args, provenance: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{{\n{provenance}  \"keys\": \"random UUIDv4 text under the measured consumer\",\n  \"min_secs\": {},\n  \"rounds\": {},\n  \"results\": [",
        args.min_secs, args.rounds
    );
    for (i, cell) in cells.iter().enumerate() {
        let entries: Vec<String> = cell
            .samples
            .iter()
            .zip(&args.scale_rows)
            .map(|((label, samples), rows)| {
                let (ratio, q1, q3) = paired(&cell.samples[0].1, samples);
                let bytes = sizes
                    .iter()
                    .find(|(b, r, _)| *b == cell.backend && r == rows)
                    .map_or(0, |s| s.2);
                let s: Vec<String> = samples.iter().map(|x| format!("{x:.1}")).collect();
                format!(
                    "{{\"inbox_rows\": {rows}, \"median_msgs_per_sec\": {:.1}, \"iqr_msgs_per_sec\": {:.1}, \
                     \"ratio_to_first\": {ratio:.3}, \"ratio_q1\": {q1:.3}, \"ratio_q3\": {q3:.3}, \
                     \"primary_key_bytes\": {bytes}, \"samples\": [{}]}}",
                    cell.median(label),
                    cell.iqr(label),
                    s.join(", ")
                )
            })
            .collect();
        let _ = write!(
            out,
            "{}\n    {{\"backend\": \"{}\", \"threads\": {}, \"sizes\": [\n      {}\n    ]}}",
            if i > 0 { "," } else { "" },
            cell.backend,
            cell.threads,
            entries.join(",\n      ")
        );
    }
    out.push_str("\n  ]\n}\n");
    out
}
