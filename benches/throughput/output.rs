//! What a run reports: the cells of samples, their medians, ratios and
//! interquartile ranges, printed, as JSON under `target/inbox-bench`, and
//! as SVG plots.

use crate::args::Args;
use crate::bench::{Cell, Target};
use crate::variants::{ASYNC_RATIOS, RATIOS};
use std::fmt::Write as _;

/// The `q` quantile of `samples` (linear interpolation between the sorted
/// samples; 0 when there are none): `q = 0.5` is the median.
pub fn quantile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = (v.len() - 1) as f64 * q;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Writes `contents` to `file` under `target/inbox-bench`; that directory.
pub fn write_output(file: &str, contents: &str) -> Result<std::path::PathBuf, String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/inbox-bench");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(file), contents).map_err(|e| e.to_string())?;
    Ok(dir)
}

impl Cell {
    fn samples_of(&self, variant: &str) -> &[f64] {
        self.samples
            .iter()
            .find(|(name, _)| *name == variant)
            .map_or(&[], |(_, s)| s.as_slice())
    }

    pub fn median(&self, variant: &str) -> f64 {
        quantile(self.samples_of(variant), 0.5)
    }

    /// The interquartile range of a variant's samples (q3 - q1).
    pub fn iqr(&self, variant: &str) -> f64 {
        let samples = self.samples_of(variant);
        quantile(samples, 0.75) - quantile(samples, 0.25)
    }

    pub fn ratio(&self, a: &str, b: &str) -> f64 {
        self.median(a) / self.median(b)
    }

    pub fn variants(&self) -> Vec<&'static str> {
        self.samples.iter().map(|(v, _)| *v).collect()
    }

    /// The ratios reported for this cell (those whose variants it has).
    pub fn ratios(&self) -> Vec<(&'static str, &'static str)> {
        let all: &[(&'static str, &'static str)] = if self.mode == "async" {
            &ASYNC_RATIOS
        } else {
            &RATIOS
        };
        let has = |v: &str| self.samples.iter().any(|(name, _)| *name == v);
        all.iter()
            .copied()
            .filter(|(a, b)| has(a) && has(b))
            .collect()
    }
}

pub fn print_cell(label: &str, cell: &Cell, args: &Args) {
    let who = if cell.mode == "async" {
        "async task(s) over a pool"
    } else {
        "thread(s)"
    };
    let size = if cell.mode != "async" && args.min_secs > 0.0 {
        format!("samples of at least {} s", args.min_secs)
    } else {
        format!("{} messages per sample", args.messages)
    };
    println!(
        "\n{label}, {} {who}, {size}, {} round(s), batch {}",
        cell.threads, args.rounds, args.batch
    );
    println!(
        "  {:<24}{:>14}{:>14}{:>14}{:>14}",
        "variant", "median msg/s", "iqr", "min", "max"
    );
    for (variant, samples) in &cell.samples {
        let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
        let max = samples.iter().copied().fold(0.0, f64::max);
        println!(
            "  {variant:<24}{:>14.0}{:>14.0}{min:>14.0}{max:>14.0}",
            cell.median(variant),
            cell.iqr(variant)
        );
    }
    for (a, b) in cell.ratios() {
        println!("  {:<36}{:>8.2}", format!("{a}/{b}"), cell.ratio(a, b));
    }
}

/// Where and when the figures were measured.
pub fn provenance(targets: &[Target]) -> String {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let servers: Vec<String> = targets
        .iter()
        .map(|t| {
            format!(
                "\"{}\": \"{}\"",
                t.name,
                (t.version)(&t.url).replace('"', "'")
            )
        })
        .collect();
    format!(
        "  \"commit\": \"{commit}\",\n  \"date\": \"{date}\",\n  \"cores\": {cores},\n  \"servers\": {{{}}},\n",
        servers.join(", ")
    )
}

pub fn to_json(cells: &[Cell], args: &Args, provenance: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{{\n{provenance}  \"messages\": {},\n  \"min_secs\": {},\n  \"rounds\": {},\n  \"batch\": {},\n  \"results\": [",
        args.messages, args.min_secs, args.rounds, args.batch
    );
    for (i, cell) in cells.iter().enumerate() {
        let _ = write!(
            out,
            "{}\n    {{\"backend\": \"{}\", \"mode\": \"{}\", \"{}\": {}, \"median_msgs_per_sec\": {{",
            if i > 0 { "," } else { "" },
            cell.backend,
            cell.mode,
            if cell.mode == "async" { "tasks" } else { "threads" },
            cell.threads
        );
        let medians: Vec<String> = cell
            .variants()
            .iter()
            .map(|v| format!("\"{v}\": {:.1}", cell.median(v)))
            .collect();
        let iqrs: Vec<String> = cell
            .variants()
            .iter()
            .map(|v| format!("\"{v}\": {:.1}", cell.iqr(v)))
            .collect();
        let ratios: Vec<String> = cell
            .ratios()
            .iter()
            .map(|(a, b)| format!("\"{a}/{b}\": {:.3}", cell.ratio(a, b)))
            .collect();
        let samples: Vec<String> = cell
            .samples
            .iter()
            .map(|(v, s)| {
                let s: Vec<String> = s.iter().map(|x| format!("{x:.1}")).collect();
                format!("\"{v}\": [{}]", s.join(", "))
            })
            .collect();
        let _ = write!(
            out,
            "{}}}, \"iqr_msgs_per_sec\": {{{}}}, \"ratios\": {{{}}}, \"samples\": {{{}}}}}",
            medians.join(", "),
            iqrs.join(", "),
            ratios.join(", "),
            samples.join(", ")
        );
    }
    out.push_str("\n  ]\n}\n");
    out
}

/// Each cell's variants as ratios to its hand-written inbox (`raw_sql`, or
/// `async_raw_sql`), median with the interquartile range as a whisker, on a
/// log scale so that a 1.05 and a 20× are both readable; 1.0 is marked.
pub fn draw_svg(path: &std::path::Path, cells: &[Cell]) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 380 * cells.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((cells.len().max(1), 1));
    for (cell, area) in cells.iter().zip(panels.iter()) {
        // Scale cells: each size against the first (the emptiest inbox).
        let base_name = match cell.mode {
            "async" => "async_raw_sql",
            "scale" => cell.samples.first().map_or("", |(v, _)| *v),
            _ => "raw_sql",
        };
        let base = cell.median(base_name).max(1e-9);
        let variants: Vec<&str> = cell
            .variants()
            .into_iter()
            .filter(|v| *v != base_name)
            .collect();
        // (median, q1, q3) of each variant over the baseline's median.
        let spread = |v: &str| {
            let (median, iqr) = (cell.median(v), cell.iqr(v));
            (
                median / base,
                (median - iqr / 2.0).max(1e-9) / base,
                (median + iqr / 2.0) / base,
            )
        };
        let (low, high) = variants
            .iter()
            .map(|v| spread(v))
            .fold((1.0f64, 1.0f64), |(lo, hi), (_, q1, q3)| {
                (lo.min(q1), hi.max(q3))
            });
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "{} · {} {} · {}messages/s ÷ {base_name} (median, IQR)",
                    cell.label,
                    cell.threads,
                    if cell.mode == "async" {
                        "async task(s)"
                    } else {
                        "thread(s)"
                    },
                    if cell.mode == "scale" {
                        "idempotent, random UUID keys, "
                    } else {
                        ""
                    }
                ),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(
                0f64..variants.len() as f64,
                ((low * 0.8)..(high * 1.25)).log_scale(),
            )?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(variants.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let i = (*x - 0.5).round();
                if (x - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < variants.len() {
                    variants[i as usize]
                        .trim_start_matches("async_")
                        .to_string()
                } else {
                    String::new()
                }
            })
            .y_desc("ratio (log)")
            .draw()?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, 1.0), (variants.len() as f64, 1.0)],
            BLACK.stroke_width(1),
        )))?;
        let ours = [
            "idempotent",
            "batch",
            "batch_loop",
            "duplicate",
            "async_idempotent",
            "async_duplicate",
        ];
        chart.draw_series(variants.iter().enumerate().map(|(i, v)| {
            let color = if ours.contains(v) || cell.mode == "scale" {
                BLUE.mix(0.7)
            } else {
                BLACK.mix(0.3)
            };
            let (ratio, _, _) = spread(v);
            Rectangle::new(
                [(i as f64 + 0.2, 1.0), (i as f64 + 0.8, ratio)],
                color.filled(),
            )
        }))?;
        chart.draw_series(variants.iter().enumerate().map(|(i, v)| {
            let (_, q1, q3) = spread(v);
            PathElement::new(
                vec![(i as f64 + 0.5, q1), (i as f64 + 0.5, q3)],
                RED.stroke_width(2),
            )
        }))?;
        chart.draw_series(variants.iter().enumerate().map(|(i, v)| {
            let (ratio, _, q3) = spread(v);
            Text::new(
                format!("{ratio:.2}"),
                (i as f64 + 0.3, q3.max(ratio) * 1.06),
                ("sans-serif", 13),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}
