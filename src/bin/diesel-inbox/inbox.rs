//! The inbox's commands on a connection: migrate, status, stats, purge,
//! forget, attempts.

use crate::cli::{AttemptsArgs, Command, DoctorArgs, ForgetArgs, PurgeArgs, StatusArgs};
use crate::format::{human, rfc3339};
use crate::Failure;
use diesel::connection::LoadConnection;
use diesel_inbox::{InboxConnection, Purge};
use std::io::IsTerminal;
use std::process::ExitCode;

/// The command, on any backend's connection.
pub(crate) fn execute<C>(conn: &mut C, command: &Command) -> Result<ExitCode, Failure>
where
    C: InboxConnection + LoadConnection,
{
    match command {
        Command::Migrate => {
            diesel_inbox::migrate(conn)?;
            println!(
                "inbox table ready (schema version {})",
                diesel_inbox::SCHEMA_VERSION
            );
        }
        Command::Status(StatusArgs {
            consumer,
            key: None,
            json,
        }) => {
            let positions = diesel_inbox::positions(conn, Some(consumer))?;
            if *json {
                let rows: Vec<_> = positions
                    .iter()
                    .map(|p| {
                        serde_json::json!({
                            "topic": p.topic,
                            "partition": p.partition,
                            "next_offset": p.next_offset,
                            "updated_at": rfc3339(p.updated_at),
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({ "consumer": consumer, "positions": rows })
                );
            } else if positions.is_empty() {
                println!("no stream positions for consumer {consumer}");
            } else {
                println!(
                    "{:<32} {:>9} {:>14}  updated_at",
                    "topic", "partition", "next_offset"
                );
                for p in &positions {
                    println!(
                        "{:<32} {:>9} {:>14}  {}",
                        p.topic,
                        p.partition,
                        p.next_offset,
                        rfc3339(p.updated_at)
                    );
                }
            }
        }
        Command::Status(StatusArgs {
            consumer,
            key: Some(key),
            json,
        }) => {
            let entry = diesel_inbox::status(conn, consumer, key)?;
            let attempts = match entry {
                Some(_) => None,
                None => diesel_inbox::attempts(conn, consumer, key)?,
            };
            if *json {
                println!(
                    "{}",
                    serde_json::json!({
                        "consumer": consumer,
                        "key": key,
                        "applied": entry.is_some(),
                        "received_at": entry.as_ref().map(|e| rfc3339(e.received_at)),
                        "attempts": attempts.as_ref().map(|a| serde_json::json!({
                            "failures": a.failures,
                            "last_error": a.last_error,
                            "updated_at": rfc3339(a.updated_at),
                        })),
                    })
                );
            } else if let Some(entry) = &entry {
                println!(
                    "applied: consumer {} key {} received_at {}",
                    entry.consumer,
                    entry.key,
                    rfc3339(entry.received_at)
                );
            } else {
                println!("not applied: no inbox row for consumer {consumer} and key {key}");
                if let Some(count) = &attempts {
                    println!(
                        "{} failed attempt{} (max_attempts), the last at {}; last error: {}",
                        count.failures,
                        if count.failures == 1 { "" } else { "s" },
                        rfc3339(count.updated_at),
                        count.last_error
                    );
                }
            }
            if entry.is_none() {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Stats { json } => {
            let stats = diesel_inbox::stats(conn)?;
            if *json {
                let rows: Vec<_> = stats
                    .iter()
                    .map(|s| {
                        serde_json::json!({
                            "consumer": s.consumer,
                            "rows": s.rows,
                            "oldest": rfc3339(s.oldest),
                            "newest": rfc3339(s.newest),
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(rows));
            } else {
                print_table(&stats);
            }
        }
        Command::Purge(options) => purge(conn, options)?,
        Command::Doctor(args) => return doctor(conn, args),
        Command::Attempts(AttemptsArgs {
            consumer,
            exhausted,
            max_attempts,
            limit,
            json,
        }) => {
            let at_least = match (exhausted, max_attempts) {
                (true, Some(max)) => *max,
                _ => 1,
            };
            let failing = diesel_inbox::attempts_list(conn, consumer.as_deref(), at_least, *limit)?;
            if *json {
                let rows: Vec<_> = failing
                    .iter()
                    .map(|a| {
                        serde_json::json!({
                            "consumer": a.consumer,
                            "key": a.key,
                            "failures": a.failures,
                            "last_error": a.last_error,
                            "updated_at": rfc3339(a.updated_at),
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(rows));
            } else {
                print_attempts(&failing);
            }
        }
        Command::Outbox { command } => return crate::outbox::execute(conn, command),
        Command::Console(_) => unreachable!("run() serves the console"),
        Command::Forget(ForgetArgs { consumer, key }) => {
            if diesel_inbox::forget(conn, consumer, key)? {
                println!("forgotten: the next delivery of {key} to {consumer} will be applied");
            } else {
                println!("nothing to forget: no inbox row for consumer {consumer} and key {key}");
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn purge<C>(conn: &mut C, options: &PurgeArgs) -> Result<(), Failure>
where
    C: InboxConnection + LoadConnection,
{
    let older_than = options.older_than;
    let consumer = options.consumer.as_deref();
    let purge = || {
        let purge = Purge::new(older_than)
            .batch_size(options.batch)
            .pause(options.pause);
        let purge = match options.sleep_coef {
            Some(coef) => purge.sleep_coef(coef),
            None => purge,
        };
        match consumer {
            Some(c) => purge.consumer(c),
            None => purge,
        }
    };
    let scope = consumer.map_or("all consumers".to_string(), |c| format!("consumer {c}"));
    let total = purge().count(conn)?;
    if options.dry_run {
        println!(
            "{}dry run: {total} rows older than {} ({scope}) would be purged",
            crate::format::line_prefix(),
            human(older_than)
        );
        return Ok(());
    }
    let report = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} rows  {per_sec}  ETA {eta}",
            )
            .map_err(|e| Failure(e.to_string()))?,
        );
        let progress = bar.clone();
        let report = purge()
            .on_batch(move |so_far| progress.set_position(so_far.rows))
            .run(conn);
        bar.finish_and_clear();
        report?
    } else {
        purge()
            .on_batch(|so_far| {
                eprintln!(
                    "purge: {} rows in {} batches, {:.0} rows/s",
                    so_far.rows,
                    so_far.batches,
                    so_far.rows as f64 / so_far.elapsed.as_secs_f64().max(1e-9)
                )
            })
            .run(conn)?
    };
    println!(
        "{}purged {} rows older than {} ({scope}) in {} batches, {:.1}s ({:.0} rows/s, {} retried), and {} failure counts",
        crate::format::line_prefix(),
        report.rows,
        human(older_than),
        report.batches,
        report.elapsed.as_secs_f64(),
        report.rows as f64 / report.elapsed.as_secs_f64().max(1e-9),
        report.retries,
        report.attempts
    );
    Ok(())
}

fn print_table(stats: &[diesel_inbox::ConsumerStats]) {
    let width = stats
        .iter()
        .map(|s| s.consumer.len())
        .max()
        .unwrap_or(0)
        .max("consumer".len());
    println!(
        "{:<width$}  {:>12}  {:<27}  {:<27}",
        "consumer", "rows", "oldest", "newest"
    );
    for s in stats {
        println!(
            "{:<width$}  {:>12}  {:<27}  {:<27}",
            s.consumer,
            s.rows,
            rfc3339(s.oldest),
            rfc3339(s.newest)
        );
    }
}

fn print_attempts(failing: &[diesel_inbox::Attempts]) {
    let width = |f: fn(&diesel_inbox::Attempts) -> usize, title: &str| {
        failing.iter().map(f).max().unwrap_or(0).max(title.len())
    };
    let (cw, kw) = (
        width(|a| a.consumer.len(), "consumer"),
        width(|a| a.key.len(), "key"),
    );
    println!(
        "{:<cw$}  {:<kw$}  {:>8}  {:<27}  last error",
        "consumer", "key", "failures", "last failure"
    );
    for a in failing {
        println!(
            "{:<cw$}  {:<kw$}  {:>8}  {:<27}  {}",
            a.consumer,
            a.key,
            a.failures,
            rfc3339(a.updated_at),
            a.last_error.replace('\n', " ")
        );
    }
}

/// Each durability prerequisite the server reports (and those it cannot
/// read), and those of the JetStream streams named, with its verdict and
/// fix; exit 1 when one is WARN.
fn doctor<C>(conn: &mut C, args: &DoctorArgs) -> Result<ExitCode, Failure>
where
    C: InboxConnection + LoadConnection,
{
    let mut listed: Vec<(String, diesel_inbox::Prerequisite)> = diesel_inbox::durability(conn)?
        .into_iter()
        .map(|p| ("database".to_owned(), p))
        .collect();
    if let Some(nats) = &args.nats {
        listed.extend(crate::doctor::nats_streams(nats, &args.streams)?);
    }
    let warned = listed
        .iter()
        .any(|(_, p)| p.verdict == diesel_inbox::Verdict::Warn);
    if args.json {
        let rows: Vec<_> = listed
            .iter()
            .map(|(scope, p)| {
                serde_json::json!({
                    "scope": scope,
                    "name": p.name,
                    "value": p.value,
                    "verdict": p.verdict.to_string().to_lowercase(),
                    "detail": p.detail,
                    "fix": p.fix,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        for (scope, prerequisite) in &listed {
            match scope.as_str() {
                "database" => println!("{prerequisite}"),
                _ => println!("{scope}: {prerequisite}"),
            }
        }
    }
    Ok(match warned {
        true => ExitCode::from(1),
        false => ExitCode::SUCCESS,
    })
}
