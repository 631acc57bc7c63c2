//! The arguments: one struct per command's options (clap derive).

use crate::format::{parse_age, parse_pause};
use clap::{Args, Parser, Subcommand};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "diesel-inbox",
    version,
    about = "Operate a diesel-inbox table: migrate, inspect, purge, replay",
    after_help = "Exit status: 0 done; 1 `status` or `forget` found no row, or `doctor` a WARN; 2 an error."
)]
pub(crate) struct Cli {
    /// The database: postgres://…, mysql://…, or a SQLite file (a path, or
    /// sqlite://path).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub(crate) database_url: Option<String>,
    /// Run the command on every tenant's database instead: a file of `NAME
    /// URL` lines, or the URL of a control database whose table
    /// inbox_tenants (name, database_url) lists them. `outbox relay` runs
    /// one relay over all of them, reading the list again every 10 s.
    /// Takes the place of --database-url and DATABASE_URL.
    #[arg(long, global = true, value_name = "FILE_OR_URL")]
    pub(crate) tenants: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Create, verify or upgrade the inbox table.
    Migrate,
    /// Whether CONSUMER has applied the message KEY, and when; if not, its
    /// failed attempts (max_attempts). Without KEY: CONSUMER's stream
    /// positions per Kafka partition (the next offset to apply).
    Status(StatusArgs),
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
    Purge(PurgeArgs),
    /// Remove the row of KEY for CONSUMER, so that its next delivery is
    /// applied again (a deliberate replay).
    Forget(ForgetArgs),
    /// The failing keys (max_attempts): failures, last error and time, the
    /// latest failure first.
    Attempts(AttemptsArgs),
    /// Every durability prerequisite of the guarantee the server reports
    /// (commits on disk before they are acknowledged; no asynchronous
    /// standby a failover could promote), and those it cannot read: ok,
    /// WARN or unknown, each with its fix.
    Doctor(DoctorArgs),
    /// The transactional outbox: inspect, replay, purge, or run a relay.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// The operations console in a browser: the inbox, the outbox, stream
    /// positions and dead messages, with retry, discard and forget; until
    /// SIGTERM or Ctrl-C.
    Console(ConsoleArgs),
}

#[derive(Args)]
pub(crate) struct DoctorArgs {
    /// JSON for scripts: [{"scope", "name", "value", "verdict", "detail",
    /// "fix"}], scope "database" or "nats stream NAME".
    #[arg(long)]
    pub(crate) json: bool,
    /// A NATS server (nats://host:port) whose JetStream streams (--stream)
    /// to read too: storage and replicas.
    #[arg(long, requires = "streams")]
    pub(crate) nats: Option<String>,
    /// A JetStream stream to read on --nats (repeat for more).
    #[arg(long = "stream", value_name = "NAME", requires = "nats")]
    pub(crate) streams: Vec<String>,
}

#[derive(Args)]
pub(crate) struct ConsoleArgs {
    /// The address to serve on: loopback unless --allow-remote.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub(crate) listen: std::net::SocketAddr,
    /// Show no action and refuse every one.
    #[arg(long)]
    pub(crate) read_only: bool,
    /// Allow a --listen address that is not loopback (needs --token).
    #[arg(long)]
    pub(crate) allow_remote: bool,
    /// A name besides localhost and loopback addresses that the console
    /// answers to without --token (repeat for more): any other Host is
    /// refused (421), so that no web page can reach it through a name of
    /// its own that resolves to loopback.
    #[arg(long = "allow-host", value_name = "NAME", value_parser = host_name)]
    pub(crate) allow_hosts: Vec<String>,
    /// A password every request must carry (HTTP Basic, any user name;
    /// the name is logged with each action).
    #[arg(long, env = "DIESEL_INBOX_CONSOLE_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// The handlers' max_attempts: the keys failing that often are shown
    /// as given up on.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: Option<u32>,
    /// The Kafka brokers (host:port[,host:port...]) to ask each stream
    /// position's lag of (the partition's high watermark).
    #[arg(long)]
    pub(crate) kafka: Option<String>,
}

#[derive(Subcommand)]
pub(crate) enum OutboxCommand {
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
    Dead(DeadArgs),
    /// Make a dead message (or every one) pending again.
    Retry(RetryArgs),
    /// Delete messages dead for longer than a period, in short batches.
    Purge(OutboxPurgeArgs),
    /// Publish the outbox until SIGTERM or Ctrl-C: to a RabbitMQ exchange
    /// (the destination is the routing key), to NATS JetStream (the
    /// destination is the subject) or to Kafka (the destination is the
    /// topic).
    Relay(RelayArgs),
    /// The WAL outbox's replication slot (PostgreSQL, wal_level = logical):
    /// create it before enqueues write to the WAL (outbox::set_wal), or
    /// remove it.
    Wal {
        #[command(subcommand)]
        command: WalCommand,
    },
}

#[derive(Subcommand)]
pub(crate) enum WalCommand {
    /// Create this database's WAL outbox slot and its publication, where
    /// they do not exist (waits for the transactions in progress to end).
    Create,
    /// Drop them: what the slot holds and no relay published is lost.
    Remove,
}

#[derive(Args)]
pub(crate) struct StatusArgs {
    pub(crate) consumer: String,
    pub(crate) key: Option<String>,
    /// JSON for scripts: {"consumer", "key", "applied", "received_at",
    /// "attempts": null or {"failures", "last_error", "updated_at"}};
    /// without KEY, {"consumer", "positions": [{"topic", "partition",
    /// "next_offset", "updated_at"}]}.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct PurgeArgs {
    /// The retention period: a number and a unit, s, m, h, d or w
    /// (e.g. 30d).
    #[arg(long, value_parser = parse_age)]
    pub(crate) older_than: Duration,
    /// Only this consumer's rows.
    #[arg(long)]
    pub(crate) consumer: Option<String>,
    /// Rows per batch; each batch is one short transaction.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) batch: usize,
    /// A fixed pause after each batch (e.g. 10ms), on top of
    /// --sleep-coef's.
    #[arg(long, value_parser = parse_pause, default_value = "0ms")]
    pub(crate) pause: Duration,
    /// The duty cycle: after each batch, pause this many times as long
    /// as the batch took (0: back to back) [default: the library's, 6].
    #[arg(long)]
    pub(crate) sleep_coef: Option<f64>,
    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Allow an --older-than under 1 hour.
    #[arg(long)]
    pub(crate) force: bool,
}

#[derive(Args)]
pub(crate) struct AttemptsArgs {
    /// Only this consumer's keys.
    #[arg(long)]
    pub(crate) consumer: Option<String>,
    /// Only the keys given up on: at least --max-attempts failures
    /// (the handlers' max_attempts, which the table does not record).
    #[arg(long, requires = "max_attempts")]
    pub(crate) exhausted: bool,
    /// The handlers' max_attempts, for --exhausted.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: Option<u32>,
    /// At most this many keys.
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: usize,
    /// JSON for scripts: [{"consumer", "key", "failures", "last_error", "updated_at"}].
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct ForgetArgs {
    pub(crate) consumer: String,
    pub(crate) key: String,
}

#[derive(Args)]
pub(crate) struct DeadArgs {
    /// At most this many, oldest first [default: 100]; with --groups, the
    /// newest this many are grouped [default: 10000].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) limit: Option<u32>,
    /// Failure groups instead: the dead messages grouped by destination
    /// and last error, with ids and numbers masked, the largest first.
    #[arg(long)]
    pub(crate) groups: bool,
    /// JSON for scripts: [{"id", "destination", "key", "attempts",
    /// "last_error", "enqueued_at", "dead_at"}]; with --groups,
    /// [{"destination", "failure", "count", "first_dead_at",
    /// "last_dead_at", "example_id", "example_error"}].
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct RetryArgs {
    /// The message id.
    #[arg(required_unless_present = "all_dead", conflicts_with = "all_dead")]
    pub(crate) id: Option<String>,
    /// Every dead message.
    #[arg(long)]
    pub(crate) all_dead: bool,
}

#[derive(Args)]
pub(crate) struct OutboxPurgeArgs {
    /// How long a message has been dead: a number and a unit, s, m, h,
    /// d or w (e.g. 7d).
    #[arg(long, value_parser = parse_age)]
    pub(crate) older_than: Duration,
    /// Rows per batch; each batch is one short transaction.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) batch: usize,
    /// Allow an --older-than under 1 hour.
    #[arg(long)]
    pub(crate) force: bool,
}

#[derive(Args)]
pub(crate) struct RelayArgs {
    #[command(flatten)]
    pub(crate) broker: Broker,
    /// The exchange to publish to, with --amqp ("" is the default exchange).
    #[arg(long)]
    pub(crate) exchange: Option<String>,
    /// Messages per batch [default: the library's, 100].
    #[arg(long)]
    pub(crate) batch_size: Option<usize>,
    /// How often to look for new messages (e.g. 500ms, 1s) [default: the
    /// library's, 1s].
    #[arg(long, value_parser = parse_pause)]
    pub(crate) poll_interval: Option<Duration>,
    /// Refusals by the broker after which a message is dead [default: the
    /// library's, 10].
    #[arg(long)]
    pub(crate) max_publish_attempts: Option<u32>,
    /// How long a claimed batch stays this relay's before the others may
    /// take it (e.g. 30s; at least 1s) [default: the library's, 60s].
    #[arg(long, value_parser = parse_lease)]
    pub(crate) lease: Option<Duration>,
    /// Stop after one pass (what is due now) instead of running.
    #[arg(long)]
    pub(crate) once: bool,
    /// Also publish the WAL outbox (PostgreSQL: `outbox wal create`, and
    /// enqueues with outbox::set_wal), streamed over a replication
    /// connection to the database URL (a role with REPLICATION; no TLS).
    #[arg(long)]
    pub(crate) wal: bool,
}

/// The broker a relay publishes to: exactly one.
#[derive(Args)]
#[group(required = true, multiple = false)]
pub(crate) struct Broker {
    /// The RabbitMQ URL (amqp://...), with --exchange.
    #[arg(long, requires = "exchange")]
    pub(crate) amqp: Option<String>,
    /// The NATS URL (nats://...).
    #[arg(long)]
    pub(crate) nats: Option<String>,
    /// The Kafka brokers (host:port[,host:port...]): the destination is the
    /// topic, the ordering key the record's key; an idempotent producer.
    #[arg(long)]
    pub(crate) kafka: Option<String>,
}

/// A relay's lease: a pause of at least a second (the library's minimum,
/// refused here rather than raised).
fn parse_lease(text: &str) -> Result<Duration, String> {
    let lease = parse_pause(text)?;
    if lease < Duration::from_secs(1) {
        return Err(format!("`{text}`: a lease is at least 1s"));
    }
    Ok(lease)
}

/// An `--allow-host` value: a host name or address (a port is ignored).
fn host_name(value: &str) -> Result<String, String> {
    let name = value.trim();
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b));
    match valid {
        true => Ok(name.to_owned()),
        false => Err(format!(
            "{value:?} is not a host name or address (e.g. ops.internal or 10.0.0.5)"
        )),
    }
}
