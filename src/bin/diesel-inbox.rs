//! `diesel-inbox`: operate the inbox table from a shell.
//!
//! ```text
//! diesel-inbox [--database-url URL] migrate
//! diesel-inbox status <CONSUMER> <KEY> [--json]
//! diesel-inbox stats [--json]
//! diesel-inbox purge --older-than 30d [--consumer C] [--batch 10000] [--pause 10ms] [--sleep-coef 1] [--dry-run] [--force]
//! diesel-inbox forget <CONSUMER> <KEY>
//! diesel-inbox attempts [--consumer C] [--exhausted --max-attempts N] [--limit 100] [--json]
//! diesel-inbox outbox status [--json]
//! diesel-inbox outbox dead [--limit 100] [--json]
//! diesel-inbox outbox retry <ID> | --all-dead
//! diesel-inbox outbox purge --older-than 7d [--batch 10000] [--force]
//! diesel-inbox outbox relay (--amqp URL --exchange X | --nats URL) [--batch-size 100] [--poll-interval 1s] [--max-publish-attempts 10]
//! ```
//!
//! The URL comes from `--database-url` or `DATABASE_URL`; its scheme picks
//! the backend: `postgres://` (feature `postgres`), `mysql://` (feature
//! `mysql`), anything else is a SQLite file (`sqlite://path` or a path).
//! Exit codes: 0 done, 1 `status`/`forget` found no row, 2 an error (one
//! line on stderr).

use clap::{Parser, Subcommand};
use diesel::connection::LoadConnection;
use diesel_inbox::{InboxConnection, InboxError, Purge};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

#[derive(Parser)]
#[command(
    name = "diesel-inbox",
    version,
    about = "Operate a diesel-inbox table: migrate, inspect, purge, replay",
    after_help = "Exit status: 0 done; 1 `status` or `forget` found no row; 2 an error."
)]
struct Cli {
    /// The database: postgres://…, mysql://…, or a SQLite file (a path, or
    /// sqlite://path).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    database_url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create, verify or upgrade the inbox table.
    Migrate,
    /// Whether CONSUMER has applied the message KEY, and when; if not, its
    /// failed attempts (max_attempts). Without KEY: CONSUMER's stream
    /// positions per Kafka partition (the next offset to apply).
    Status {
        consumer: String,
        key: Option<String>,
        /// JSON for scripts: {"consumer", "key", "applied", "received_at",
        /// "attempts": null or {"failures", "last_error", "updated_at"}};
        /// without KEY, {"consumer", "positions": [{"topic", "partition",
        /// "next_offset", "updated_at"}]}.
        #[arg(long)]
        json: bool,
    },
    /// Rows, oldest and newest claim per consumer.
    Stats {
        /// JSON for scripts instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete rows older than a retention period, in short batches.
    ///
    /// Retention must exceed the longest redelivery horizon (broker
    /// redelivery, dead-letter replays, consumer downtime): a message
    /// redelivered after its row is purged is applied again.
    Purge {
        /// The retention period: a number and a unit, s, m, h, d or w
        /// (e.g. 30d).
        #[arg(long, value_parser = parse_age)]
        older_than: Duration,
        /// Only this consumer's rows.
        #[arg(long)]
        consumer: Option<String>,
        /// Rows per batch; each batch is one short transaction.
        #[arg(long, default_value_t = 10_000)]
        batch: usize,
        /// A fixed pause after each batch (e.g. 10ms), on top of
        /// --sleep-coef's.
        #[arg(long, value_parser = parse_pause, default_value = "0ms")]
        pause: Duration,
        /// The duty cycle: after each batch, pause this many times as long
        /// as the batch took (0: back to back; the library's default).
        #[arg(long, default_value_t = diesel_inbox::DEFAULT_SLEEP_COEF)]
        sleep_coef: f64,
        /// Count what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Allow an --older-than under 1 hour.
        #[arg(long)]
        force: bool,
    },
    /// Remove the row of KEY for CONSUMER, so that its next delivery is
    /// applied again (a deliberate replay).
    Forget { consumer: String, key: String },
    /// The failing keys (max_attempts): failures, last error and time, the
    /// latest failure first.
    Attempts {
        /// Only this consumer's keys.
        #[arg(long)]
        consumer: Option<String>,
        /// Only the keys given up on: at least --max-attempts failures
        /// (the handlers' max_attempts, which the table does not record).
        #[arg(long, requires = "max_attempts")]
        exhausted: bool,
        /// The handlers' max_attempts, for --exhausted.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_attempts: Option<u32>,
        /// At most this many keys.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// JSON for scripts: [{"consumer", "key", "failures", "last_error", "updated_at"}].
        #[arg(long)]
        json: bool,
    },
    /// The transactional outbox: inspect, replay, purge, or run a relay.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
}

#[derive(Subcommand)]
enum OutboxCommand {
    /// Pending, scheduled (delayed, not yet due) and dead messages per
    /// destination, the oldest pending message's age and when the next
    /// scheduled one is due.
    Status {
        /// JSON for scripts: {"pending", "scheduled", "dead",
        /// "oldest_pending_age_secs", "next_scheduled_in_secs",
        /// "destinations": [{"destination", "pending", "scheduled", "dead",
        /// "oldest_pending_age_secs", "next_scheduled_in_secs"}]}.
        #[arg(long)]
        json: bool,
    },
    /// The dead messages (refused by the broker max_attempts times),
    /// oldest first.
    Dead {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// JSON for scripts: [{"id", "destination", "key", "attempts",
        /// "last_error", "enqueued_at", "dead_at"}].
        #[arg(long)]
        json: bool,
    },
    /// Make a dead message (or every one) pending again.
    Retry {
        /// The message id.
        #[arg(required_unless_present = "all_dead", conflicts_with = "all_dead")]
        id: Option<String>,
        /// Every dead message.
        #[arg(long)]
        all_dead: bool,
    },
    /// Delete messages dead for longer than a period, in short batches.
    Purge {
        /// How long a message has been dead: a number and a unit, s, m, h,
        /// d or w (e.g. 7d).
        #[arg(long, value_parser = parse_age)]
        older_than: Duration,
        /// Rows per batch; each batch is one short transaction.
        #[arg(long, default_value_t = 10_000)]
        batch: usize,
        /// Allow an --older-than under 1 hour.
        #[arg(long)]
        force: bool,
    },
    /// Publish the outbox until SIGTERM or Ctrl-C: to a RabbitMQ exchange
    /// (the destination is the routing key) or to NATS JetStream (the
    /// destination is the subject).
    Relay {
        /// The RabbitMQ URL (amqp://...), with --exchange.
        #[arg(
            long,
            required_unless_present = "nats",
            conflicts_with = "nats",
            requires = "exchange"
        )]
        amqp: Option<String>,
        /// The exchange to publish to ("" is the default exchange).
        #[arg(long)]
        exchange: Option<String>,
        /// The NATS URL (nats://...).
        #[arg(long)]
        nats: Option<String>,
        /// Messages per batch.
        #[arg(long, default_value_t = 100)]
        batch_size: usize,
        /// How often to look for new messages (e.g. 500ms, 1s).
        #[arg(long, value_parser = parse_pause, default_value = "1s")]
        poll_interval: Duration,
        /// Refusals by the broker after which a message is dead.
        #[arg(long, default_value_t = 10)]
        max_publish_attempts: u32,
        /// Stop after one pass (what is due now) instead of running.
        #[arg(long)]
        once: bool,
    },
}

/// A failure: its one-line message.
struct Failure(String);

impl From<InboxError> for Failure {
    fn from(e: InboxError) -> Self {
        Failure(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(Failure(message)) => {
            eprintln!("error: {}", message.replace('\n', " "));
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let url = cli
        .database_url
        .ok_or_else(|| Failure("no database: pass --database-url or set DATABASE_URL".into()))?;
    if let Command::Outbox {
        command: OutboxCommand::Relay { .. },
    } = &cli.command
    {
        return relay::run(&url, &cli.command);
    }
    if let Command::Purge {
        older_than, force, ..
    }
    | Command::Outbox {
        command: OutboxCommand::Purge {
            older_than, force, ..
        },
    } = &cli.command
    {
        if *older_than < Duration::from_secs(3600) && !force {
            return Err(Failure(format!(
                "refusing --older-than {}: under 1 hour, a message still being redelivered after its row is purged would be applied again (retention must exceed the longest redelivery horizon); pass --force to purge anyway",
                human(*older_than)
            )));
        }
    }
    match Backend::of(&url)? {
        Backend::Postgres => on_postgres(&url, &cli.command),
        Backend::Mysql => on_mysql(&url, &cli.command),
        Backend::Sqlite(path) => on_sqlite(path, &cli.command),
    }
}

enum Backend<'a> {
    Postgres,
    Mysql,
    Sqlite(&'a str),
}

impl<'a> Backend<'a> {
    /// The backend the URL's scheme names.
    fn of(url: &'a str) -> Result<Self, Failure> {
        match url.split_once("://") {
            Some(("postgres" | "postgresql", _)) => Ok(Backend::Postgres),
            Some(("mysql" | "mariadb", _)) => Ok(Backend::Mysql),
            Some(("sqlite", path)) => Ok(Backend::Sqlite(path)),
            Some((scheme, _)) => Err(Failure(format!(
                "unsupported database URL scheme `{scheme}://`: use postgres://, mysql:// or a SQLite file (a path or sqlite://path)"
            ))),
            None if url.is_empty() => Err(Failure("the database URL is empty".into())),
            None => Ok(Backend::Sqlite(url.strip_prefix("sqlite:").unwrap_or(url))),
        }
    }
}

/// The URL without its password, for messages.
fn redacted(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, rest)), Some(at)) => {
            let credentials = &rest[..at - scheme.len() - 3];
            let user = credentials.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***{}", &url[at..])
        }
        _ => url.to_string(),
    }
}

fn connect<C: diesel::Connection>(url: &str) -> Result<C, Failure> {
    C::establish(url).map_err(|e| {
        Failure(format!(
            "cannot connect to {}: {}",
            redacted(url),
            e.to_string().trim()
        ))
    })
}

#[cfg(feature = "postgres")]
fn on_postgres(url: &str, command: &Command) -> Result<ExitCode, Failure> {
    execute(&mut connect::<diesel::PgConnection>(url)?, command)
}

#[cfg(not(feature = "postgres"))]
fn on_postgres(_: &str, _: &Command) -> Result<ExitCode, Failure> {
    Err(Failure(
        "this diesel-inbox was built without PostgreSQL: cargo install diesel-inbox --features cli,postgres".into(),
    ))
}

#[cfg(feature = "mysql")]
fn on_mysql(url: &str, command: &Command) -> Result<ExitCode, Failure> {
    execute(&mut connect::<diesel::MysqlConnection>(url)?, command)
}

#[cfg(not(feature = "mysql"))]
fn on_mysql(_: &str, _: &Command) -> Result<ExitCode, Failure> {
    Err(Failure(
        "this diesel-inbox was built without MySQL/MariaDB: cargo install diesel-inbox --features cli,mysql".into(),
    ))
}

#[cfg(feature = "sqlite")]
fn on_sqlite(path: &str, command: &Command) -> Result<ExitCode, Failure> {
    // SQLite creates a missing file on connect: only `migrate` may.
    let is_file = path.starts_with("file:") || path == ":memory:";
    if !matches!(command, Command::Migrate) && !is_file && !std::path::Path::new(path).exists() {
        return Err(Failure(format!(
            "no SQLite database at {path} (`diesel-inbox migrate` creates one)"
        )));
    }
    let mut conn = connect::<diesel::SqliteConnection>(path)?;
    diesel::connection::SimpleConnection::batch_execute(&mut conn, "PRAGMA busy_timeout = 10000")
        .map_err(|e| Failure(e.to_string()))?;
    execute(&mut conn, command)
}

#[cfg(not(feature = "sqlite"))]
fn on_sqlite(_: &str, _: &Command) -> Result<ExitCode, Failure> {
    Err(Failure(
        "this diesel-inbox was built without SQLite: cargo install diesel-inbox --features cli,sqlite".into(),
    ))
}

/// The command, on any backend's connection.
fn execute<C>(conn: &mut C, command: &Command) -> Result<ExitCode, Failure>
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
        Command::Status {
            consumer,
            key: None,
            json,
        } => {
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
        Command::Status {
            consumer,
            key: Some(key),
            json,
        } => {
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
        Command::Purge {
            older_than,
            consumer,
            batch,
            pause,
            sleep_coef,
            dry_run,
            ..
        } => purge(
            conn,
            *older_than,
            consumer.as_deref(),
            (*batch, *pause, *sleep_coef),
            *dry_run,
        )?,
        Command::Attempts {
            consumer,
            exhausted,
            max_attempts,
            limit,
            json,
        } => {
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
        Command::Outbox { command } => return outbox(conn, command),
        Command::Forget { consumer, key } => {
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

fn purge<C>(
    conn: &mut C,
    older_than: Duration,
    consumer: Option<&str>,
    (batch, pause, sleep_coef): (usize, Duration, f64),
    dry_run: bool,
) -> Result<(), Failure>
where
    C: InboxConnection + LoadConnection,
{
    let options = || {
        let purge = Purge::new(older_than)
            .batch_size(batch)
            .pause(pause)
            .sleep_coef(sleep_coef);
        match consumer {
            Some(c) => purge.consumer(c),
            None => purge,
        }
    };
    let scope = consumer.map_or("all consumers".to_string(), |c| format!("consumer {c}"));
    let total = options().count(conn)?;
    if dry_run {
        println!(
            "dry run: {total} rows older than {} ({scope}) would be purged",
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
        let report = options()
            .on_batch(move |so_far| progress.set_position(so_far.rows))
            .run(conn);
        bar.finish_and_clear();
        report?
    } else {
        options()
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
        "purged {} rows older than {} ({scope}) in {} batches, {:.1}s ({:.0} rows/s, {} retried), and {} failure counts",
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

/// `30d`, `12h`, `90m`, `3600s`, `2w`.
fn parse_age(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` has no unit: use s, m, h, d or w (e.g. 30d)"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a number (e.g. 30d)"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        other => return Err(format!("unknown unit `{other}`: use s, m, h, d or w")),
    };
    n.checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("`{text}` is too long"))
}

/// `10ms`, `1s`.
fn parse_pause(text: &str) -> Result<Duration, String> {
    let (number, scale) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 1)
    } else if let Some(s) = text.strip_suffix('s') {
        (s, 1000)
    } else {
        return Err(format!("`{text}`: give a pause in ms or s (e.g. 10ms)"));
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a number (e.g. 10ms)"))?;
    Ok(Duration::from_millis(n.saturating_mul(scale)))
}

/// A duration as its largest whole unit.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    for (unit, size) in [("w", 7 * 86_400), ("d", 86_400), ("h", 3600), ("m", 60)] {
        if s >= size && s % size == 0 {
            return format!("{}{unit}", s / size);
        }
    }
    format!("{s}s")
}

/// `2026-11-30T12:34:56.789012Z`.
fn rfc3339(t: SystemTime) -> String {
    let (micros, sign) = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => (d.as_micros() as i128, 1),
        Err(e) => (e.duration().as_micros() as i128, -1),
    };
    let micros = sign * micros;
    let seconds = micros.div_euclid(1_000_000);
    let fraction = micros.rem_euclid(1_000_000);
    let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{fraction:06}Z",
        second_of_day / 3600,
        second_of_day % 3600 / 60,
        second_of_day % 60
    )
}

/// The proleptic Gregorian date of a day count from 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_parse_and_print() {
        assert_eq!(parse_age("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_age("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_age("2w"), Ok(Duration::from_secs(14 * 86_400)));
        assert!(parse_age("30").is_err());
        assert!(parse_age("d").is_err());
        assert!(parse_age("3y").is_err());
        assert_eq!(human(Duration::from_secs(30 * 86_400)), "30d");
        assert_eq!(human(Duration::from_secs(600)), "10m");
        assert_eq!(human(Duration::from_secs(61)), "61s");
        assert_eq!(parse_pause("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_pause("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_pause("10").is_err());
        assert!(parse_pause("xms").is_err());
    }

    #[test]
    fn times_print_as_rfc3339() {
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH),
            "1970-01-01T00:00:00.000000Z"
        );
        let t = SystemTime::UNIX_EPOCH + Duration::from_micros(1_764_505_696_123_456);
        assert_eq!(rfc3339(t), "2025-11-30T12:28:16.123456Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000000Z");
    }

    #[test]
    fn schemes_pick_the_backend() {
        assert!(matches!(
            Backend::of("postgres://u@h/d"),
            Ok(Backend::Postgres)
        ));
        assert!(matches!(Backend::of("mysql://u@h/d"), Ok(Backend::Mysql)));
        assert!(matches!(
            Backend::of("sqlite:///tmp/x.db"),
            Ok(Backend::Sqlite("/tmp/x.db"))
        ));
        assert!(matches!(
            Backend::of("inbox.db"),
            Ok(Backend::Sqlite("inbox.db"))
        ));
        assert!(Backend::of("redis://h").is_err());
        assert_eq!(
            redacted("postgres://user:secret@127.0.0.1/db"),
            "postgres://user:***@127.0.0.1/db"
        );
    }
}

/// `outbox status|dead|retry|purge`.
fn outbox<C>(conn: &mut C, command: &OutboxCommand) -> Result<ExitCode, Failure>
where
    C: InboxConnection + LoadConnection,
{
    use diesel_inbox::outbox;
    let secs = |age: Option<Duration>| age.map(|a| a.as_secs_f64());
    match command {
        OutboxCommand::Status { json } => {
            let status = outbox::status(conn)?;
            if *json {
                let destinations: Vec<_> = status
                    .destinations
                    .iter()
                    .map(|d| {
                        serde_json::json!({
                            "destination": d.destination,
                            "pending": d.pending,
                            "scheduled": d.scheduled,
                            "dead": d.dead,
                            "oldest_pending_age_secs": secs(d.oldest_pending_age),
                            "next_scheduled_in_secs": secs(d.next_scheduled_in),
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({
                        "pending": status.pending,
                        "scheduled": status.scheduled,
                        "dead": status.dead,
                        "oldest_pending_age_secs": secs(status.oldest_pending_age),
                        "next_scheduled_in_secs": secs(status.next_scheduled_in),
                        "destinations": destinations,
                    })
                );
            } else {
                let age = |a: Option<Duration>| a.map_or("-".to_string(), human);
                println!(
                    "pending {}, scheduled {}, dead {}, oldest pending {}, next scheduled in {}",
                    status.pending,
                    status.scheduled,
                    status.dead,
                    age(status.oldest_pending_age),
                    age(status.next_scheduled_in)
                );
                for d in &status.destinations {
                    println!(
                        "  {}: pending {}, scheduled {}, dead {}, oldest pending {}, next scheduled in {}",
                        d.destination,
                        d.pending,
                        d.scheduled,
                        d.dead,
                        age(d.oldest_pending_age),
                        age(d.next_scheduled_in)
                    );
                }
            }
        }
        OutboxCommand::Dead { limit, json } => {
            let dead = outbox::dead(conn, *limit)?;
            if *json {
                let rows: Vec<_> = dead
                    .iter()
                    .map(|d| {
                        serde_json::json!({
                            "id": d.id,
                            "destination": d.destination,
                            "ordering_key": d.ordering_key,
                            "attempts": d.attempts,
                            "last_error": d.last_error,
                            "enqueued_at": rfc3339(d.enqueued_at),
                            "dead_at": rfc3339(d.dead_at),
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(rows));
            } else if dead.is_empty() {
                println!("no dead messages");
            } else {
                for d in &dead {
                    println!(
                        "{} to {} ({} attempts, dead since {}): {}",
                        d.id,
                        d.destination,
                        d.attempts,
                        rfc3339(d.dead_at),
                        d.last_error
                    );
                }
            }
        }
        OutboxCommand::Retry { id, all_dead } => {
            let replayed = match (id, all_dead) {
                (Some(id), false) => outbox::retry(conn, id.as_str())?,
                _ => outbox::retry(conn, outbox::AllDead)?,
            };
            println!("{replayed} dead message(s) pending again");
            if replayed == 0 {
                return Ok(ExitCode::from(1));
            }
        }
        OutboxCommand::Purge {
            older_than, batch, ..
        } => {
            let report = outbox::purge(conn, *older_than, *batch)?;
            println!(
                "purged {} dead message(s) in {} batch(es), {:.1}s",
                report.rows,
                report.batches,
                report.elapsed.as_secs_f64()
            );
        }
        OutboxCommand::Relay { .. } => unreachable!("run() starts the relay"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `outbox relay`: a relay as a process of its own.
#[cfg(any(feature = "lapin", feature = "nats"))]
mod relay {
    use super::{Backend, Command, Failure, OutboxCommand};
    use diesel_async::pooled_connection::deadpool::Pool;
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_inbox::outbox::{Publish, Relay, RelayPool};
    use std::process::ExitCode;

    pub(super) fn run(url: &str, command: &Command) -> Result<ExitCode, Failure> {
        let Command::Outbox {
            command:
                OutboxCommand::Relay {
                    amqp,
                    exchange,
                    nats,
                    batch_size,
                    poll_interval,
                    max_publish_attempts,
                    once,
                },
        } = command
        else {
            unreachable!("a relay command")
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Failure(format!("no async runtime: {e}")))?;
        let options = (*batch_size, *poll_interval, *max_publish_attempts, *once);
        runtime.block_on(async {
            match (amqp, nats) {
                (Some(amqp), _) => {
                    #[cfg(feature = "lapin")]
                    {
                        let exchange = exchange.clone().unwrap_or_default();
                        let publisher = diesel_inbox::outbox::lapin::Publisher::connect(amqp.as_str(), exchange);
                        on_database(url, publisher, options).await
                    }
                    #[cfg(not(feature = "lapin"))]
                    {
                        let _ = (amqp, exchange);
                        Err(Failure("this diesel-inbox was built without RabbitMQ: cargo install diesel-inbox --features cli,lapin".into()))
                    }
                }
                (None, Some(nats)) => {
                    #[cfg(feature = "nats")]
                    {
                        let client = async_nats::ConnectOptions::new()
                            .retry_on_initial_connect()
                            .connect(nats.as_str())
                            .await
                            .map_err(|e| Failure(format!("cannot connect to NATS at {nats}: {e}")))?;
                        let publisher = diesel_inbox::outbox::nats::Publisher::new(async_nats::jetstream::new(client));
                        on_database(url, publisher, options).await
                    }
                    #[cfg(not(feature = "nats"))]
                    {
                        let _ = nats;
                        Err(Failure("this diesel-inbox was built without NATS: cargo install diesel-inbox --features cli,nats".into()))
                    }
                }
                (None, None) => Err(Failure("pass --amqp URL --exchange X or --nats URL".into())),
            }
        })
    }

    /// A small pool of `$conn`s for the relay (a claim and a status).
    macro_rules! pool {
        ($conn:ty, $url:expr) => {
            Pool::builder(AsyncDieselConnectionManager::<$conn>::new($url))
                .max_size(2)
                .build()
                .map_err(|e| Failure(format!("no connection pool: {e}")))?
        };
    }

    type Options = (usize, std::time::Duration, u32, bool);

    async fn on_database<P: Publish>(
        url: &str,
        publisher: P,
        options: Options,
    ) -> Result<ExitCode, Failure> {
        match Backend::of(url)? {
            #[cfg(feature = "postgres")]
            Backend::Postgres => {
                relay(
                    pool!(diesel_async::AsyncPgConnection, url),
                    publisher,
                    options,
                )
                .await
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql => {
                relay(
                    pool!(diesel_async::AsyncMysqlConnection, url),
                    publisher,
                    options,
                )
                .await
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(path) => {
                type Sqlite = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<
                    diesel::SqliteConnection,
                >;
                relay(pool!(Sqlite, path), publisher, options).await
            }
            #[allow(unreachable_patterns)]
            _ => Err(Failure(
                "this diesel-inbox was built without this database's feature".into(),
            )),
        }
    }

    async fn relay<D: RelayPool, P: Publish>(
        pool: D,
        publisher: P,
        (batch_size, poll_interval, max_publish_attempts, once): Options,
    ) -> Result<ExitCode, Failure> {
        let relay = Relay::new(pool, publisher)
            .batch_size(batch_size)
            .poll_interval(poll_interval)
            .max_publish_attempts(max_publish_attempts);
        let report = if once {
            relay.run_once().await.map_err(|e| Failure(e.to_string()))?
        } else {
            let stop = async {
                #[cfg(unix)]
                {
                    let mut term =
                        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                            .expect("a SIGTERM handler");
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                }
                #[cfg(not(unix))]
                let _ = tokio::signal::ctrl_c().await;
            };
            relay.run(stop).await.map_err(|e| Failure(e.to_string()))?
        };
        println!(
            "published {}, failed {}, dead {}, given back {}",
            report.published, report.failed, report.dead, report.released
        );
        Ok(ExitCode::SUCCESS)
    }
}

#[cfg(not(any(feature = "lapin", feature = "nats")))]
mod relay {
    use super::{Command, Failure};
    use std::process::ExitCode;

    pub(super) fn run(_: &str, _: &Command) -> Result<ExitCode, Failure> {
        Err(Failure(
            "this diesel-inbox was built without a broker: cargo install diesel-inbox --features cli,lapin (or nats)".into(),
        ))
    }
}
