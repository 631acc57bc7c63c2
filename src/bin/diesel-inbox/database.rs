//! The backend a database URL names, its connection, and the command run
//! on it.

use crate::cli::Command;
use crate::Failure;
use std::process::ExitCode;

/// The command on the database `url` names.
pub(crate) fn execute(url: &str, command: &Command) -> Result<ExitCode, Failure> {
    match Backend::of(url)? {
        Backend::Postgres => on_postgres(url, command),
        Backend::Mysql => on_mysql(url, command),
        Backend::Sqlite(path) => on_sqlite(path, command),
    }
}

pub(crate) enum Backend<'a> {
    Postgres,
    Mysql,
    Sqlite(&'a str),
}

impl<'a> Backend<'a> {
    /// The backend the URL's scheme names.
    pub(crate) fn of(url: &'a str) -> Result<Self, Failure> {
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
pub(crate) fn redacted(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, rest)), Some(at)) => {
            let credentials = &rest[..at - scheme.len() - 3];
            let user = credentials.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***{}", &url[at..])
        }
        _ => url.to_string(),
    }
}

pub(crate) fn connect<C: diesel::Connection>(url: &str) -> Result<C, Failure> {
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
    crate::inbox::execute(&mut connect::<diesel::PgConnection>(url)?, command)
}

#[cfg(not(feature = "postgres"))]
fn on_postgres(_: &str, _: &Command) -> Result<ExitCode, Failure> {
    Err(Failure(
        "this diesel-inbox was built without PostgreSQL: cargo install diesel-inbox --features cli,postgres".into(),
    ))
}

#[cfg(feature = "mysql")]
fn on_mysql(url: &str, command: &Command) -> Result<ExitCode, Failure> {
    crate::inbox::execute(&mut connect::<diesel::MysqlConnection>(url)?, command)
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
    crate::inbox::execute(&mut conn, command)
}

#[cfg(not(feature = "sqlite"))]
fn on_sqlite(_: &str, _: &Command) -> Result<ExitCode, Failure> {
    Err(Failure(
        "this diesel-inbox was built without SQLite: cargo install diesel-inbox --features cli,sqlite".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
