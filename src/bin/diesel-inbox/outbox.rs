//! The outbox's commands on a connection: status, dead, retry, purge, wal.

use crate::cli::{DeadArgs, OutboxCommand, OutboxPurgeArgs, RetryArgs, WalCommand};
use crate::format::{human, rfc3339};
use crate::Failure;
use diesel::connection::LoadConnection;
use diesel_inbox::InboxConnection;
use std::process::ExitCode;
use std::time::Duration;

/// `outbox status|dead|retry|purge|wal`.
pub(crate) fn execute<C>(conn: &mut C, command: &OutboxCommand) -> Result<ExitCode, Failure>
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
                        "wal": status.wal.as_ref().map(|w| serde_json::json!({
                            "slot": w.slot,
                            "active": w.active,
                            "retained_bytes": w.retained_bytes,
                            "unconfirmed_bytes": w.unconfirmed_bytes,
                            "lost": w.lost,
                        })),
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
                if let Some(w) = &status.wal {
                    println!(
                        "WAL outbox slot {}: {}, keeps {} bytes of WAL, {} bytes past its confirmed position{}",
                        w.slot,
                        if w.active { "streamed by a relay" } else { "no relay streams it" },
                        w.retained_bytes,
                        w.unconfirmed_bytes,
                        if w.lost {
                            "; LOST: the server invalidated it, its messages are gone (outbox wal remove, then create)"
                        } else {
                            ""
                        }
                    );
                }
            }
        }
        OutboxCommand::Dead(DeadArgs {
            limit,
            groups: true,
            json,
        }) => {
            let scan = limit.unwrap_or(10_000) as usize;
            let groups = outbox::dead_groups(conn, &outbox::DeadFilter::new(), scan)?;
            if *json {
                let rows: Vec<_> = groups
                    .iter()
                    .map(|g| {
                        serde_json::json!({
                            "destination": g.destination,
                            "failure": g.failure,
                            "count": g.count,
                            "first_dead_at": rfc3339(g.first_dead_at),
                            "last_dead_at": rfc3339(g.last_dead_at),
                            "example_id": g.example_id,
                            "example_error": g.example_error,
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(rows));
            } else if groups.is_empty() {
                println!("no dead messages");
            } else {
                let counted: u64 = groups.iter().map(|g| g.count).sum();
                if counted == scan as u64 {
                    println!("the newest {scan} dead messages (--limit to read more):");
                }
                for g in &groups {
                    println!(
                        "{} x{} to {} (dead {} to {}; e.g. {}): {}",
                        g.failure,
                        g.count,
                        g.destination,
                        rfc3339(g.first_dead_at),
                        rfc3339(g.last_dead_at),
                        g.example_id,
                        g.example_error
                    );
                }
            }
        }
        OutboxCommand::Dead(DeadArgs { limit, json, .. }) => {
            let dead = outbox::dead(conn, limit.unwrap_or(100) as usize)?;
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
        OutboxCommand::Retry(RetryArgs { id, all_dead }) => {
            let replayed = match (id, all_dead) {
                (Some(id), false) => outbox::retry(conn, id.as_str())?,
                _ => outbox::retry(conn, outbox::AllDead)?,
            };
            println!("{replayed} dead message(s) pending again");
            if replayed == 0 {
                return Ok(ExitCode::from(1));
            }
        }
        OutboxCommand::Purge(OutboxPurgeArgs {
            older_than, batch, ..
        }) => {
            let report = outbox::purge(conn, *older_than, *batch)?;
            println!(
                "{}purged {} dead message(s) in {} batch(es), {:.1}s",
                crate::format::line_prefix(),
                report.rows,
                report.batches,
                report.elapsed.as_secs_f64()
            );
        }
        OutboxCommand::Wal {
            command: WalCommand::Create,
        } => {
            outbox::wal::create(conn)?;
            println!("the WAL outbox's slot is ready: enqueues with outbox::set_wal(true) write to it, and `outbox relay --wal` publishes it");
        }
        OutboxCommand::Wal {
            command: WalCommand::Remove,
        } => {
            outbox::wal::remove(conn)?;
            println!("the WAL outbox's slot is removed: enqueues to the WAL are refused");
        }
        OutboxCommand::Relay(_) => unreachable!("run() starts the relay"),
    }
    Ok(ExitCode::SUCCESS)
}
