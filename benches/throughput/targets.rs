//! The `--backend` targets: each backend compiled in and configured, its
//! generic code (the variants and the modes) instantiated.

use crate::args::Args;
#[cfg(feature = "mysql")]
use crate::backends::mysql;
#[cfg(feature = "postgres")]
use crate::backends::postgres;
#[cfg(feature = "sqlite")]
use crate::backends::sqlite;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::bench::Server;
use crate::bench::{Bench, Target};

impl Target {
    fn of<B: Bench>(url: String) -> Target {
        Target {
            name: B::NAME,
            label: B::LABEL,
            url,
            setup: crate::variants::setup::<B>,
            measure: crate::variants::measure::<B>,
            version: B::version,
            #[cfg(feature = "async")]
            measure_async: (
                crate::variants::measure_async::<B>,
                crate::variants::has_async::<B>,
            ),
            server: None,
            #[cfg(all(feature = "async", feature = "lapin"))]
            outbox: crate::outbox::measure::<B>,
        }
    }

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn server<B: Server>(url: String) -> Target {
        Target {
            server: Some((crate::scale::measure::<B>, crate::purge::measure::<B>)),
            ..Target::of::<B>(url)
        }
    }

    /// A server target from its URL variable; `None` after a SKIPPED line.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn from_env<B: Server>(var: &str) -> Option<Target> {
        match std::env::var(var) {
            Ok(url) if !url.is_empty() => Some(Target::server::<B>(url)),
            _ => {
                println!(
                    "SKIPPED: {}: {var} is not set (e.g. {}://diesel_inbox:diesel_inbox@127.0.0.1/diesel_inbox_test; the database must exist)",
                    B::NAME,
                    B::NAME
                );
                None
            }
        }
    }
}

/// The `--backend` targets compiled in and configured.
pub fn targets(args: &Args) -> Vec<Target> {
    let wanted = |name: &str| args.backends.iter().any(|b| b == "all" || b == name);
    let mut all = Vec::new();
    #[cfg(feature = "sqlite")]
    if wanted(sqlite::Sqlite::NAME) {
        let file = format!("diesel-inbox-bench-{}.db", crate::run_id());
        let path = std::env::temp_dir().join(file);
        all.push(Target::of::<sqlite::Sqlite>(
            path.to_string_lossy().into_owned(),
        ));
    }
    #[cfg(feature = "postgres")]
    if wanted(postgres::Postgres::NAME) {
        all.extend(Target::from_env::<postgres::Postgres>(
            "INBOX_TEST_POSTGRES_URL",
        ));
    }
    #[cfg(feature = "mysql")]
    if wanted(mysql::Mysql::NAME) {
        all.extend(Target::from_env::<mysql::Mysql>("INBOX_TEST_MYSQL_URL"));
    }
    let _ = wanted;
    all
}
