//! `--outbox --outbox-horizon SECS` (PostgreSQL, MySQL/MariaDB): the
//! relay's rate before, during and after a transaction held open (a
//! `REPEATABLE READ` transaction that has read: its snapshot holds the
//! vacuum horizon, or InnoDB's purge, so the rows the relay deletes stay
//! as dead tuples or delete-marked records until it ends).
//!
//! Each sample fills the outbox with `--outbox-messages` messages (a key
//! each, or over `--outbox-keys` keys; the fill vacuums the table first and analyzes it after, untimed, as autovacuum would)
//! and times `Relay::run_once` publishing them to RabbitMQ. Three samples
//! before; then, with the transaction open, samples until it has been
//! open `SECS` seconds and at least 50,000 messages have flowed; then
//! three samples after its commit.

use crate::args::Args;
use crate::bench::Bench;
use crate::outbox_fill::{fill, median};
use diesel::connection::SimpleConnection;
use diesel_inbox::outbox::Relay;
use std::time::{Duration, Instant};

/// Messages that flow while the transaction is open, at least.
const DURING: usize = 50_000;

pub(crate) fn measure<B: Bench>(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    args: &Args,
    relay: &Relay<B::RelayPool, diesel_inbox::outbox::lapin::Publisher>,
    queue: &str,
    channel: &lapin::Channel,
) -> Result<String, String> {
    let n = args.outbox_messages;
    let sample = || -> Result<f64, String> {
        fill::<B>(url, n, args.outbox_keys, queue)?;
        let began = Instant::now();
        let report = runtime
            .block_on(relay.run_once())
            .map_err(|e| e.to_string())?;
        let rate = report.published as f64 / began.elapsed().as_secs_f64();
        if report.published != n as u64 {
            return Err(format!("relay published {} of {n}", report.published));
        }
        runtime
            .block_on(channel.queue_purge(queue.into(), Default::default()))
            .map_err(|e| e.to_string())?;
        Ok(rate)
    };
    let mut before = (0..3).map(|_| sample()).collect::<Result<Vec<_>, _>>()?;

    let mut holder = B::open(url);
    holder
        .batch_execute(B::HOLD_SNAPSHOT.ok_or("--outbox-horizon: not on this backend")?)
        .map_err(|e| e.to_string())?;
    let opened = Instant::now();
    let hold = Duration::from_secs(args.outbox_horizon);
    let mut during = Vec::new();
    while opened.elapsed() < hold || during.len() * n < DURING {
        let rate = sample()?;
        println!(
            "{}: relay with a transaction open {:.0} s: {rate:.0} msg/s",
            B::LABEL,
            opened.elapsed().as_secs_f64()
        );
        during.push(rate);
    }
    let held = opened.elapsed();
    holder.batch_execute("COMMIT").map_err(|e| e.to_string())?;
    let mut after = (0..3).map(|_| sample()).collect::<Result<Vec<_>, _>>()?;

    let before_rate = median(&mut before);
    let after_rate = median(&mut after);
    let first = during[0];
    let last = *during.last().expect("a sample");
    let lowest = during.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "{}: relay before {before_rate:.0} msg/s; with a transaction open {:.0} s ({} messages): first {first:.0}, last {last:.0}, lowest {lowest:.0} ({:.2} of before); after its commit {after_rate:.0}",
        B::LABEL,
        held.as_secs_f64(),
        during.len() * n,
        lowest / before_rate
    );
    Ok(format!(
        "{{\"messages_per_sample\": {n}, \"held_secs\": {:.1}, \"before\": {before_rate:.1}, \
         \"during\": {during:?}, \"after\": {after_rate:.1}, \"lowest_over_before\": {:.3}}}",
        held.as_secs_f64(),
        lowest / before_rate
    ))
}
