//! `--tenants`: the tenants a command runs over, from a list file or a
//! directory table, and each command run once per tenant.

use crate::cli::Command;
use crate::database::Backend;
use crate::Failure;
use std::collections::BTreeMap;
use std::process::ExitCode;

/// The directory table a control database holds: one row per tenant.
pub(crate) const DIRECTORY_TABLE: &str = "inbox_tenants";

/// The tenants `source` lists, as `(name, database URL)` pairs, in order.
///
/// - A file: one tenant per line, `NAME URL` (blank lines and lines
///   starting with `#` skipped).
/// - A `postgres://`, `mysql://` or `sqlite://` URL: the control database
///   whose table `inbox_tenants (name, database_url)` lists them.
pub(crate) fn read(source: &str) -> Result<Vec<(String, String)>, Failure> {
    let is_url = matches!(
        source.split_once("://"),
        Some((
            "postgres" | "postgresql" | "mysql" | "mariadb" | "sqlite",
            _
        ))
    );
    let listed = if is_url {
        directory(source)?
    } else {
        let text = std::fs::read_to_string(source).map_err(|e| {
            let source = crate::database::redacted(source);
            Failure(format!(
                "--tenants {source}: cannot read the tenant list: {e} (a file of `NAME URL` lines, or a postgres://, mysql:// or sqlite:// URL of a database with a table {DIRECTORY_TABLE} (name, database_url))"
            ))
        })?;
        parse(source, &text)?
    };
    let source = crate::database::redacted(source);
    let (mut names, mut urls) = (BTreeMap::new(), BTreeMap::new());
    for (name, url) in &listed {
        if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Failure(format!(
                "--tenants {source}: the tenant name {name:?} is empty or holds a space or a control character"
            )));
        }
        if name == "." || name == ".." {
            // A browser resolves the console's `/tenants/../` before it asks.
            return Err(Failure(format!(
                "--tenants {source}: the tenant name {name:?} cannot be a path segment of the console's pages: rename the tenant"
            )));
        }
        if names.insert(name.as_str(), ()).is_some() {
            return Err(Failure(format!(
                "--tenants {source}: tenant {name} is listed twice"
            )));
        }
        // A scheme, always: a bare path or a keyword connection string
        // would be taken for a SQLite file, and created.
        let known = matches!(
            url.split_once("://"),
            Some(("postgres" | "postgresql" | "mysql" | "mariadb" | "sqlite", rest)) if !rest.is_empty()
        );
        if !known {
            return Err(Failure(format!(
                "--tenants {source}: tenant {name}'s database URL must start with postgres://, mysql:// or sqlite://, found {}",
                crate::database::redacted(url)
            )));
        }
        if let Some(other) = urls.insert(url.as_str(), name.as_str()) {
            return Err(Failure(format!(
                "--tenants {source}: tenants {other} and {name} have the same database: each tenant's outbox must be its own"
            )));
        }
    }
    Ok(listed)
}

/// The backend every tenant of `listed` is on, or why not one: one relay
/// or console serves one backend.
#[cfg(any(
    feature = "lapin",
    feature = "nats",
    feature = "kafka",
    feature = "console"
))]
pub(crate) fn one_backend(listed: &[(String, String)]) -> Result<Kind, Failure> {
    let mut kinds = listed
        .iter()
        .map(|(name, url)| Ok::<_, Failure>((name, Kind::of(url)?)));
    let Some(first) = kinds.next() else {
        return Err(Failure("no tenant is listed".into()));
    };
    let (first_name, kind) = first?;
    for other in kinds {
        let (name, other) = other?;
        if other != kind {
            return Err(Failure(format!(
                "tenants {first_name} and {name} are on different backends: one relay or console serves one backend (run one per backend)"
            )));
        }
    }
    Ok(kind)
}

/// A tenant's backend.
#[cfg(any(
    feature = "lapin",
    feature = "nats",
    feature = "kafka",
    feature = "console"
))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Postgres,
    Mysql,
    Sqlite,
}

#[cfg(any(
    feature = "lapin",
    feature = "nats",
    feature = "kafka",
    feature = "console"
))]
impl Kind {
    fn of(url: &str) -> Result<Kind, Failure> {
        Ok(match Backend::of(url)? {
            Backend::Postgres => Kind::Postgres,
            Backend::Mysql => Kind::Mysql,
            Backend::Sqlite(_) => Kind::Sqlite,
        })
    }
}

/// Whether the command prints JSON (`--json`), which `--tenants` does not
/// take: one JSON document per tenant under text lines is no JSON.
pub(crate) fn wants_json(command: &Command) -> bool {
    use crate::cli::OutboxCommand;
    match command {
        Command::Stats { json } => *json,
        Command::Status(args) => args.json,
        Command::Attempts(args) => args.json,
        Command::Outbox { command } => match command {
            OutboxCommand::Status { json } => *json,
            OutboxCommand::Dead(args) => args.json,
            _ => false,
        },
        _ => false,
    }
}

/// A list file's `NAME URL` lines.
fn parse(source: &str, text: &str) -> Result<Vec<(String, String)>, Failure> {
    let mut listed = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some(name), Some(url), None) => listed.push((name.to_owned(), url.to_owned())),
            _ => {
                return Err(Failure(format!(
                    "--tenants {source}, line {}: expected `NAME URL`, found `{line}`",
                    number + 1
                )))
            }
        }
    }
    Ok(listed)
}

/// The rows of the directory table in the control database `url`.
fn directory(url: &str) -> Result<Vec<(String, String)>, Failure> {
    use diesel::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        database_url: String,
    }
    let query = diesel::sql_query(format!(
        "SELECT name, database_url FROM {DIRECTORY_TABLE} ORDER BY name"
    ));
    let failed = |e: diesel::result::Error| {
        Failure(format!(
            "--tenants: cannot read the table {DIRECTORY_TABLE} (name, database_url) of the control database: {e}"
        ))
    };
    let rows: Vec<Row> = match Backend::of(url)? {
        #[cfg(feature = "postgres")]
        Backend::Postgres => query
            .load(&mut crate::database::connect::<diesel::PgConnection>(url)?)
            .map_err(failed)?,
        #[cfg(feature = "mysql")]
        Backend::Mysql => query
            .load(&mut crate::database::connect::<diesel::MysqlConnection>(
                url,
            )?)
            .map_err(failed)?,
        #[cfg(feature = "sqlite")]
        Backend::Sqlite(path) => query
            .load(&mut crate::database::connect::<diesel::SqliteConnection>(
                path,
            )?)
            .map_err(failed)?,
        #[allow(unreachable_patterns)]
        _ => {
            let _ = (query, failed);
            return Err(Failure(
                "this diesel-inbox was built without the control database's feature".into(),
            ));
        }
    };
    Ok(rows.into_iter().map(|r| (r.name, r.database_url)).collect())
}

/// `command` on every tenant `source` lists, one after the other: each
/// tenant's output under a line `tenant NAME:` (`purge` and `outbox
/// purge`: one line per tenant, `tenant NAME: purged ...`). A tenant that
/// fails is reported (`error: tenant NAME: ...` on stderr) and the others
/// go on; the exit status is then 2, else the highest of the tenants'.
pub(crate) fn execute(source: &str, command: &Command) -> Result<ExitCode, Failure> {
    let tenants = read(source)?;
    if tenants.is_empty() {
        return Err(Failure(format!(
            "--tenants {}: no tenant is listed",
            crate::database::redacted(source)
        )));
    }
    let one_line = matches!(
        command,
        Command::Purge(_)
            | Command::Outbox {
                command: crate::cli::OutboxCommand::Purge(_)
            }
    );
    let (mut failed, mut worst) = (0, 0u8);
    for (name, url) in &tenants {
        if one_line {
            crate::format::set_line_prefix(Some(format!("tenant {name}: ")));
        } else {
            println!("tenant {name}:");
        }
        match crate::database::execute(url, command) {
            Ok(code) => {
                if code != ExitCode::SUCCESS {
                    worst = 1;
                }
            }
            Err(Failure(message)) => {
                failed += 1;
                eprintln!("error: tenant {name}: {}", message.replace('\n', " "));
            }
        }
    }
    crate::format::set_line_prefix(None);
    match (failed, worst) {
        (0, 0) => Ok(ExitCode::SUCCESS),
        (0, _) => Ok(ExitCode::from(1)),
        (n, _) => Err(Failure(format!(
            "{n} of {} tenants failed (each said why above)",
            tenants.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_file_reads_name_and_url_per_line() {
        let text = "# tenants\nacme postgres://u@h/acme\n\n  globex   mysql://u@h/globex  \n";
        let listed = parse("t.txt", text)
            .map_err(|Failure(e)| e)
            .expect("parsed");
        assert_eq!(
            listed,
            vec![
                ("acme".to_owned(), "postgres://u@h/acme".to_owned()),
                ("globex".to_owned(), "mysql://u@h/globex".to_owned())
            ]
        );
        let Err(Failure(e)) = parse("t.txt", "acme\n") else {
            panic!("a line without a URL is refused")
        };
        assert_eq!(
            e,
            "--tenants t.txt, line 1: expected `NAME URL`, found `acme`"
        );
    }
}
