use super::shape::{CatalogRow, Column, Index, Table};
use super::{database_error, Catalog, InboxBackend, Sealed};
use crate::error::{InboxError, TableProblem};
use crate::schema::inbox_messages::dsl::*;
use crate::transaction::in_transaction;
use diesel::connection::{AnsiTransactionManager, Connection, LoadConnection};
use diesel::prelude::*;
use diesel::result::Error;
use diesel::sqlite::Sqlite;

impl Sealed for Sqlite {}

/// What SQLite's schema says about `inbox_messages`, one row per thing:
/// - `table`: a = `table` or `view`;
/// - `version`: a = the SQL of the view `inbox_schema_version`;
/// - `column`: a = declared type, b = position in the primary key (0: not
///   in it), d = `notnull`, `default` flags;
/// - `primary` / `unique` / `index`: a = columns (`<expr>` for an
///   expression), b = `partial`, c = the collation of each column;
/// - `foreign key` / `trigger` (on INSERT): the name.
const CATALOG: &str = r#"
SELECT 'table' AS kind, name, type AS a, NULL AS b, NULL AS c, NULL AS d
FROM sqlite_master WHERE name = 'inbox_messages' AND type IN ('table', 'view')
UNION ALL
SELECT 'version', name, sql, NULL, NULL, NULL
FROM sqlite_master WHERE type = 'view' AND name = 'inbox_schema_version'
UNION ALL
SELECT 'column', name, type, CAST(pk AS TEXT), NULL,
       rtrim(CASE WHEN "notnull" THEN 'notnull,' ELSE '' END ||
             CASE WHEN dflt_value IS NOT NULL OR hidden IN (2, 3) THEN 'default' ELSE '' END, ',')
FROM pragma_table_xinfo('inbox_messages')
UNION ALL
SELECT CASE WHEN il.origin = 'pk' THEN 'primary' WHEN il."unique" THEN 'unique' ELSE 'index' END,
       il.name,
       (SELECT group_concat(coalesce(x.name, '<expr>'), ',')
          FROM (SELECT name FROM pragma_index_xinfo(il.name) WHERE key = 1 ORDER BY seqno) x),
       CASE WHEN il.partial THEN 'partial' END,
       (SELECT group_concat(x.coll, ',')
          FROM (SELECT coll FROM pragma_index_xinfo(il.name) WHERE key = 1 ORDER BY seqno) x),
       NULL
FROM pragma_index_list('inbox_messages') il
UNION ALL
SELECT DISTINCT 'foreign key', 'to ' || "table", NULL, NULL, NULL, NULL
FROM pragma_foreign_key_list('inbox_messages')
UNION ALL
SELECT 'trigger', name, NULL, NULL, NULL, NULL
FROM sqlite_master
WHERE type = 'trigger' AND tbl_name = 'inbox_messages'
  AND instr(upper(substr(sql, 1, instr(upper(sql), ' ON '))), 'INSERT') > 0
"#;

impl InboxBackend for Sqlite {
    const DDL: &'static str = super::ddl::SQLITE;
    // A deferred BEGIN that later writes fails at once with "database is
    // locked", whatever the busy timeout: take the write lock up front.
    const BEGIN: &'static str = "BEGIN IMMEDIATE";
    const KEY_TYPE: &'static str = "VARCHAR(255) NOT NULL with the BINARY collation (the default)";
    const UPGRADES: &'static [&'static str] = &[];

    fn claim<C>(conn: &mut C, consumer_name: &str, key: &str) -> QueryResult<bool>
    where
        C: Connection<Backend = Self>,
    {
        diesel::insert_into(inbox_messages)
            .values((consumer.eq(consumer_name), message_id.eq(key)))
            .on_conflict((consumer, message_id))
            .do_nothing()
            .execute(conn)
            .map(|inserted| inserted == 1)
    }

    fn claim_batch<C>(conn: &mut C, consumer_name: &str, keys: &[&str]) -> QueryResult<Vec<String>>
    where
        C: LoadConnection<Backend = Self>,
    {
        claim_batch_by_lookup!(conn, consumer_name, keys)
    }

    fn is_transient(error: &Error) -> bool {
        // SQLITE_BUSY and SQLITE_LOCKED, by their message.
        database_error(error).is_some_and(|(_, message)| {
            message.contains("database is locked") || message.contains("database table is locked")
        })
    }

    fn is_privilege_error(_error: &Error) -> bool {
        // No roles: a read-only file is not a grant to ask for.
        false
    }

    fn catalog<C>(conn: &mut C) -> QueryResult<Catalog>
    where
        C: LoadConnection<Backend = Self>,
    {
        let mut rows: Vec<CatalogRow> = diesel::sql_query(CATALOG).load(conn)?;
        // Columns first: the primary key's collations are judged on them.
        rows.sort_by_key(|row| row.kind != "column");
        let mut catalog = Catalog::default();
        let mut table = Table::default();
        let mut exists = false;
        let mut key_positions: Vec<(u32, String)> = Vec::new();
        for row in rows {
            match row.kind.as_str() {
                "table" => {
                    exists = true;
                    if row.a.as_deref() != Some("table") {
                        table.problems.push(TableProblem::new(
                            "`inbox_messages` is a view, not a table",
                            "drop it and run migrate() to create the table",
                        ));
                    }
                }
                "version" => catalog.version = row.a.as_deref().and_then(parse_version_view),
                "column" => {
                    let flags = row.d.as_deref().unwrap_or("");
                    let position: u32 = row.b.as_deref().and_then(|p| p.parse().ok()).unwrap_or(0);
                    if position > 0 {
                        key_positions.push((position, row.name.clone()));
                    }
                    table.columns.push(Column {
                        key_problem: affinity_problem(row.a.as_deref().unwrap_or("")),
                        required: flags.contains("notnull") && !flags.contains("default"),
                        has_default: flags.contains("default"),
                        name: row.name,
                    });
                }
                "primary" | "unique" | "index" => {
                    let columns = row.columns();
                    let collations: Vec<&str> = row.c.as_deref().unwrap_or("").split(',').collect();
                    if row.kind == "primary" {
                        // The primary key's collation decides which keys are equal.
                        for (column, collation) in columns.iter().zip(&collations) {
                            let judged = table.columns.iter_mut().find(|c| &c.name == column);
                            if let Some(judged) = judged.filter(|c| c.key_problem.is_none()) {
                                judged.key_problem = collation_problem(collation);
                            }
                        }
                    }
                    let problem = if row.b.is_some() {
                        Some("is partial (it has a WHERE clause)".to_string())
                    } else if columns.iter().any(|c| c == "<expr>") {
                        Some("is on an expression".to_string())
                    } else {
                        None
                    };
                    table.indexes.push(Index {
                        primary: row.kind == "primary",
                        unique: row.kind != "index",
                        columns,
                        problem,
                        name: row.name,
                    });
                }
                "foreign key" => table.constraints.push(("foreign key", row.name)),
                "trigger" => table.insert_hooks.push(("trigger", row.name)),
                _ => {}
            }
        }
        // An INTEGER PRIMARY KEY is the rowid and has no index of its own.
        if !table.indexes.iter().any(|i| i.primary) && !key_positions.is_empty() {
            key_positions.sort();
            table.indexes.push(Index {
                name: "rowid".to_string(),
                primary: true,
                unique: true,
                columns: key_positions.into_iter().map(|(_, name)| name).collect(),
                problem: None,
            });
        }
        catalog.table = exists.then_some(table);
        Ok(catalog)
    }

    fn record_version(version: u32) -> String {
        format!(
            "DROP VIEW IF EXISTS inbox_schema_version;\n\
             CREATE VIEW inbox_schema_version AS SELECT {version} AS version;"
        )
    }

    fn exclusively<C, T>(
        conn: &mut C,
        f: impl FnOnce(&mut C) -> Result<T, InboxError>,
    ) -> Result<T, InboxError>
    where
        C: LoadConnection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        // The immediate transaction serializes concurrent runs; SQLite DDL
        // is transactional.
        in_transaction(conn, f)
    }
}

/// The version in `CREATE VIEW inbox_schema_version AS SELECT 1 AS version`.
fn parse_version_view(sql: &str) -> Option<u32> {
    let mut words = sql.split_whitespace();
    words.find(|w| w.eq_ignore_ascii_case("SELECT"))?;
    words.next()?.parse().ok()
}

/// SQLite converts text that looks like a number in a column of integer,
/// real or numeric affinity: `007` and `7` would become one key.
fn affinity_problem(declared: &str) -> Option<String> {
    let upper = declared.to_ascii_uppercase();
    // The affinity rules of https://sqlite.org/datatype3.html, in order.
    let affinity = if upper.contains("INT") {
        "INTEGER"
    } else if ["CHAR", "CLOB", "TEXT", "BLOB"]
        .iter()
        .any(|t| upper.contains(t))
        || upper.is_empty()
    {
        // Text affinity, or none (BLOB): text is stored as given.
        return None;
    } else if upper.contains("REAL") || upper.contains("FLOA") || upper.contains("DOUB") {
        "REAL"
    } else {
        "NUMERIC"
    };
    Some(format!(
        "is declared {declared} ({affinity} affinity), which turns numeric-looking keys into numbers (`007` and `7` become one key)"
    ))
}

fn collation_problem(collation: &str) -> Option<String> {
    match collation {
        "BINARY" => None,
        "NOCASE" => Some("compares with collation NOCASE, which ignores ASCII case".to_string()),
        "RTRIM" => Some("compares with collation RTRIM, which ignores trailing spaces".to_string()),
        other => Some(format!(
            "compares with collation {other}, not BINARY (byte for byte)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::result::DatabaseErrorKind;

    #[test]
    fn transient_errors_are_busy_and_locked() {
        let error = |message: &str| {
            Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message.to_string()))
        };
        assert!(Sqlite::is_transient(&error("database is locked")));
        assert!(Sqlite::is_transient(&error("database table is locked")));
        assert!(!Sqlite::is_transient(&error("deadlock detected")));
    }

    #[test]
    fn the_version_view_is_parsed() {
        assert_eq!(
            parse_version_view("CREATE VIEW inbox_schema_version AS SELECT 12 AS version"),
            Some(12)
        );
        assert_eq!(parse_version_view("CREATE VIEW x AS SELECT 'a'"), None);
    }

    #[test]
    fn integer_and_numeric_affinities_are_refused() {
        assert!(affinity_problem("INTEGER").is_some());
        assert!(affinity_problem("NUMERIC(10)").is_some());
        assert_eq!(affinity_problem("VARCHAR(255)"), None);
        assert_eq!(affinity_problem(""), None);
    }
}
