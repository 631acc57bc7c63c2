//! The operations console in a real browser: Debian's Chromium, headless,
//! through WebDriver (`chromium-driver`, fantoccini), on consoles served
//! over TCP. PostgreSQL with real data made by the library (consumers, a
//! handler with `max_attempts`, an HTTP key, an outbox with dead,
//! scheduled and pending messages, a Kafka position): the overview's
//! numbers equal the CLI's, a `<script>` payload does not run, retrying a
//! dead message makes the relay publish it (checked at RabbitMQ), discard
//! removes it, lookup and forget, the live update, actions refused
//! without the CSRF token, from a peer that is not loopback and on a
//! read-only console, a database that refuses or hangs. SQLite and
//! MariaDB: the overview and the dead messages render their rows.
//! `diesel-inbox console`: the addresses it refuses, `--read-only`,
//! `--token` (and the log of who acted), SIGTERM.
//! Screenshots of each page go to `target/console/`.

#[path = "../support/mod.rs"]
mod support;

#[cfg(all(feature = "console", feature = "sqlite", feature = "cli"))]
mod browser;
#[cfg(all(feature = "console", feature = "sqlite", feature = "cli"))]
mod cli;
#[cfg(all(feature = "console", feature = "sqlite", feature = "cli"))]
mod data;
#[cfg(all(feature = "console", feature = "sqlite", feature = "cli"))]
mod scenarios;

#[cfg(all(feature = "console", feature = "sqlite", feature = "cli"))]
fn main() {
    scenarios::main();
}

#[cfg(not(all(feature = "console", feature = "sqlite", feature = "cli")))]
fn main() {
    println!("SKIPPED: the console's tests need the features console, sqlite and cli: cargo test --all-features --test console");
}
