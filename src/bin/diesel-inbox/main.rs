//! `diesel-inbox`: operate the inbox table from a shell.
//!
//! ```text
//! diesel-inbox [--database-url URL] migrate
//! diesel-inbox status <CONSUMER> <KEY> [--json]
//! diesel-inbox stats [--json]
//! diesel-inbox doctor [--nats URL --stream S ...] [--json]
//! diesel-inbox purge --older-than 30d [--consumer C] [--batch 10000] [--pause 10ms] [--sleep-coef 1] [--dry-run] [--force]
//! diesel-inbox forget <CONSUMER> <KEY>
//! diesel-inbox attempts [--consumer C] [--exhausted --max-attempts N] [--limit 100] [--json]
//! diesel-inbox outbox status [--json]
//! diesel-inbox outbox dead [--limit 100] [--groups] [--json]
//! diesel-inbox outbox retry <ID> | --all-dead
//! diesel-inbox outbox purge --older-than 7d [--batch 10000] [--force]
//! diesel-inbox outbox relay (--amqp URL --exchange X | --nats URL | --kafka BROKERS) [--batch-size 100] [--poll-interval 1s] [--max-publish-attempts 10] [--lease 60s]
//! diesel-inbox console [--listen 127.0.0.1:8080] [--read-only] [--allow-remote --token T] [--max-attempts N] [--kafka BROKERS]
//! ```
//!
//! `--tenants FILE_OR_URL` runs a command on
//! every tenant's database instead (`outbox relay`: one relay over all;
//! `console`: one console over all):
//! a file of `NAME URL` lines, or a control database's table
//! `inbox_tenants (name, database_url)`.
//!
//! The URL comes from `--database-url` or `DATABASE_URL`; its scheme picks
//! the backend: `postgres://` (feature `postgres`), `mysql://` (feature
//! `mysql`), anything else is a SQLite file (`sqlite://path` or a path).
//! Exit codes: 0 done, 1 `status`/`forget` found no row or `doctor` a
//! WARN, 2 an error (one line on stderr). `outbox relay` logs the library's events on stderr
//! (`info` and above; `RUST_LOG` filters them, target `diesel_inbox`); the
//! other commands only when `RUST_LOG` is set.

//!
//! The files, as diesel_cli lays them out: `cli.rs` the arguments (clap),
//! `database.rs` the backend a URL names and its connection, `inbox.rs` and
//! `outbox.rs` the commands on a connection, `doctor.rs` `doctor`'s
//! brokers, `relay.rs` the relay process,
//! `console.rs` the console's server, `pool.rs` the pool both run on,
//! `format.rs` how durations and times read and print.

mod cli;
mod console;
mod database;
mod doctor;
mod format;
mod inbox;
mod outbox;
#[cfg(feature = "relay")]
mod pool;
mod relay;
mod tenants;

use clap::Parser;
use cli::{Cli, Command, OutboxCommand};
use diesel_inbox::InboxError;
use std::process::ExitCode;
use std::time::Duration;

/// A failure: its one-line message.
struct Failure(String);

impl From<InboxError> for Failure {
    fn from(e: InboxError) -> Self {
        Failure(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let relay = matches!(
        &cli.command,
        Command::Outbox {
            command: OutboxCommand::Relay(_)
        } | Command::Console(_)
    );
    log(relay);
    match run(cli) {
        Ok(code) => code,
        Err(Failure(message)) => {
            eprintln!("error: {}", message.replace('\n', " "));
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, Failure> {
    if let Some(source) = &cli.tenants {
        return over_tenants(source, &cli.command);
    }
    let url = cli
        .database_url
        .ok_or_else(|| Failure("no database: pass --database-url or set DATABASE_URL".into()))?;
    match &cli.command {
        Command::Outbox {
            command: OutboxCommand::Relay(relay),
        } => return relay::run(&url, relay),
        Command::Console(console) => return console::run(&url, console),
        Command::Purge(purge) => check_retention(purge.older_than, purge.force)?,
        Command::Outbox {
            command: OutboxCommand::Purge(purge),
        } => check_retention(purge.older_than, purge.force)?,
        _ => {}
    }
    database::execute(&url, &cli.command)
}

/// The library's events on stderr: the relay's at `info` and above
/// (target `diesel_inbox`: its start, dead messages, a transaction-mode
/// proxy), filtered by `RUST_LOG` if set (`RUST_LOG=diesel_inbox=debug`).
/// The other commands log only when `RUST_LOG` asks: their errors are one
/// line of their own.
fn log(relay: bool) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => {
            match tracing_subscriber::EnvFilter::try_new(&directives) {
                Ok(filter) => filter,
                Err(e) => {
                    eprintln!("warning: RUST_LOG={directives} ignored: {e}");
                    return;
                }
            }
        }
        _ if relay => tracing_subscriber::EnvFilter::new("warn,diesel_inbox=info"),
        _ => return,
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .try_init();
}

/// The command over every tenant `source` lists (`--tenants`).
fn over_tenants(source: &str, command: &Command) -> Result<ExitCode, Failure> {
    match command {
        Command::Outbox {
            command: OutboxCommand::Relay(relay),
        } => return relay::run_tenants(source, relay),
        Command::Console(console) => return console::run_tenants(source, console),
        Command::Doctor(_)
        | Command::Forget(_)
        | Command::Outbox {
            command: OutboxCommand::Wal { .. },
        } => {
            return Err(Failure(
                "--tenants runs migrate, status, stats, purge, attempts, console and the outbox's status, dead, retry, purge and relay; doctor, forget and outbox wal take one --database-url".into(),
            ))
        }
        _ if tenants::wants_json(command) => {
            return Err(Failure(
                "--json takes one --database-url: under --tenants each tenant's output is text under a line `tenant NAME:`".into(),
            ))
        }
        Command::Purge(purge) => check_retention(purge.older_than, purge.force)?,
        Command::Outbox {
            command: OutboxCommand::Purge(purge),
        } => check_retention(purge.older_than, purge.force)?,
        _ => {}
    }
    tenants::execute(source, command)
}

/// Refuses a purge under an hour without `--force`.
fn check_retention(older_than: Duration, force: bool) -> Result<(), Failure> {
    if older_than < Duration::from_secs(3600) && !force {
        return Err(Failure(format!(
            "refusing --older-than {}: under 1 hour, a message still being redelivered after its row is purged would be applied again (retention must exceed the longest redelivery horizon); pass --force to purge anyway",
            format::human(older_than)
        )));
    }
    Ok(())
}
