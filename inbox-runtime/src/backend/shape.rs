//! What the runtime relies on in an existing `inbox_messages` table, checked
//! against the catalog by `migrate`. Each backend reads its catalog and
//! judges its own types and collations; the rules here are common.

use crate::error::{InboxError, TableProblem};
use crate::prerequisite::Prerequisite;

/// The inbox table as the catalog describes it.
/// One row of a backend's catalog query: what `kind` of thing, its `name`,
/// and up to four details whose meaning each backend's query documents.
#[derive(diesel::QueryableByName, Debug)]
#[cfg(feature = "_any-backend")]
pub(crate) struct CatalogRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub(crate) kind: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub(crate) name: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub(crate) a: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub(crate) b: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub(crate) c: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub(crate) d: Option<String>,
}

#[cfg(feature = "_any-backend")]
impl CatalogRow {
    /// The comma-separated list in `a`, the columns of an index.
    pub(crate) fn columns(&self) -> Vec<String> {
        self.a
            .as_deref()
            .unwrap_or("")
            .split(',')
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

/// What a backend knows about the rows of its own catalog query. Every
/// query yields the same kinds of rows:
/// - `table`: c = the version record (as [`Dialect::version`] reads it),
///   a and b what [`Dialect::table_problems`] judges;
/// - `column`: d = `notnull` and `default` flags (a generated column counts
///   as having a default), a to c what [`Dialect::key_problem`] judges;
/// - `primary` / `unique` / `index`: a = its columns in order, b and c what
///   [`Dialect::index_problem`] judges;
/// - `foreign key`, `check constraint`, `trigger` (on INSERT), `rule` (on
///   INSERT): the name.
#[cfg(feature = "_any-backend")]
pub(crate) trait Dialect {
    /// The catalog query: the rows above, for the table the connection
    /// resolves `inbox_messages` to.
    const CATALOG: &'static str;
    /// The schema version in the table row's record.
    fn version(record: &str) -> Option<u32>;
    /// What a `setting` row (its `name`, and details `a` to `d` as the
    /// backend's query documents) says about durability: whether the
    /// server keeps a commit it acknowledged (a business change whose
    /// message was acked to the broker, an enqueued message) through a
    /// crash and a failover. `None` for a row it does not judge.
    fn durability(setting: &CatalogRow) -> Option<Prerequisite> {
        let _ = setting;
        None
    }
    /// The prerequisites a client of this backend cannot read, to check by
    /// hand (`diesel-inbox doctor` lists them as unknown).
    fn unreadable() -> Vec<Prerequisite> {
        Vec::new()
    }
    /// Problems with the table object itself (a view, an engine without
    /// transactions, an unlogged table).
    fn table_problems(table: &CatalogRow) -> Vec<TableProblem>;
    /// Why a column of this type and collation cannot hold every key and
    /// compare keys byte for byte.
    fn key_problem(column: &CatalogRow) -> Option<String>;
    /// Why an index does not cover whole values.
    fn index_problem(index: &CatalogRow) -> Option<String>;
}

/// What the catalog says about `inbox_messages`, on a sync connection: the
/// backend's [`Dialect::CATALOG`], read.
#[cfg(feature = "_any-backend")]
pub(crate) fn catalog<C>(conn: &mut C) -> diesel::QueryResult<Catalog>
where
    C: diesel::connection::LoadConnection<Backend: Dialect>,
    for<'a> diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'a, C, CatalogRow>,
{
    let rows =
        diesel::RunQueryDsl::load(diesel::sql_query(<C::Backend as Dialect>::CATALOG), conn)?;
    Ok(read::<C::Backend>(rows))
}

/// [`catalog`] on a diesel-async connection (SQLite's hands [`catalog`]
/// to its blocking thread).
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
pub(crate) async fn catalog_async<C>(conn: &mut C) -> diesel::QueryResult<Catalog>
where
    C: diesel_async::AsyncConnection<Backend: Dialect>,
    for<'a> diesel::query_builder::SqlQuery: diesel_async::methods::LoadQuery<'a, C, CatalogRow>,
{
    let rows =
        diesel_async::RunQueryDsl::load(diesel::sql_query(<C::Backend as Dialect>::CATALOG), conn)
            .await?;
    Ok(read::<C::Backend>(rows))
}

/// The catalog that the rows of a backend's catalog query describe.
#[cfg(feature = "_any-backend")]
pub(crate) fn read<D: Dialect>(rows: Vec<CatalogRow>) -> Catalog {
    let mut catalog = Catalog::default();
    let mut table = Table::default();
    let mut exists = false;
    for row in rows {
        let flags = row.d.as_deref().unwrap_or("");
        match row.kind.as_str() {
            "table" => {
                exists = true;
                catalog.version = row.c.as_deref().and_then(D::version);
                table.problems.extend(D::table_problems(&row));
            }
            "column" => table.columns.push(Column {
                key_problem: D::key_problem(&row),
                required: flags.contains("notnull") && !flags.contains("default"),
                has_default: flags.contains("default"),
                name: row.name,
            }),
            "primary" | "unique" | "index" => table.indexes.push(Index {
                columns: row.columns(),
                primary: row.kind == "primary",
                unique: row.kind != "index",
                problem: D::index_problem(&row),
                name: row.name,
            }),
            "foreign key" => table.constraints.push(("foreign key", row.name)),
            "check constraint" => table.constraints.push(("check constraint", row.name)),
            "attempts" => catalog.attempts_columns.push(row.name),
            "outbox" => catalog.outbox_columns.push(row.name),
            "positions" => catalog.positions_columns.push(row.name),
            "function" => catalog.functions.push(row.name),
            "may create" => catalog.may_create = true,
            "trigger" => table.insert_hooks.push(("trigger", row.name)),
            "rule" => table.insert_hooks.push(("rule", row.name)),
            "setting" => {
                if let Some(prerequisite) = D::durability(&row) {
                    crate::prerequisite::warn_once(&prerequisite);
                    catalog.prerequisites.push(prerequisite);
                }
            }
            _ => {}
        }
    }
    catalog.table = exists.then_some(table);
    catalog.prerequisites.extend(D::unreadable());
    catalog
}

#[derive(Debug, Default)]
pub struct Catalog {
    /// The schema version recorded with the table (`None` for a table of a
    /// release before versioning, or none at all).
    pub(crate) version: Option<u32>,
    /// `None` when there is no `inbox_messages` table.
    pub(crate) table: Option<Table>,
    /// The columns of `inbox_attempts` (schema 2), empty without it.
    pub(crate) attempts_columns: Vec<String>,
    /// The columns of `outbox_messages` (schema 3), empty without it.
    pub(crate) outbox_columns: Vec<String>,
    /// The columns of `inbox_positions` (schema 4), empty without it.
    pub(crate) positions_columns: Vec<String>,
    /// The runtime's other objects that exist (PostgreSQL's view
    /// `diesel_inbox_refused`).
    pub(crate) functions: Vec<String>,
    /// Whether the role may create objects in the schema the tables are
    /// created in (read on PostgreSQL only).
    pub(crate) may_create: bool,
    /// The durability settings the catalog query read, as judged by the
    /// backend ([`Dialect::durability`]).
    pub(crate) prerequisites: Vec<Prerequisite>,
}

/// The verdict on the catalog's tables: every problem of an existing
/// `inbox_messages` (and of `inbox_attempts`) as
/// [`InboxError::IncompatibleTable`]; `Ok` when there is none, or no table
/// (the claim's own error says so). `migrate` refuses a table on it, and so
/// does the first claim on each connection, for tables that `migrate`
/// never saw. `key_type` is the backend's column type for keys, named in
/// fixes.
pub(crate) fn refuse(catalog: &Catalog, key_type: &str) -> Result<(), InboxError> {
    let Some(table) = &catalog.table else {
        return Ok(());
    };
    let mut found = problems(table, key_type, catalog.version);
    for side in side_tables(catalog, catalog.version.is_some_and(|v| v >= 5)) {
        found.extend(side_table_problems(catalog.version, side));
    }
    match found.is_empty() {
        true => Ok(()),
        false => Err(InboxError::IncompatibleTable(found)),
    }
}

/// What `migrate` refuses: every problem of the tables that exist, but
/// what it makes itself (a missing library table, or a column that a
/// schema step added), whatever version is recorded.
pub(crate) fn unfixable(catalog: &Catalog, key_type: &str) -> Vec<TableProblem> {
    let mut found = foreign_outbox(catalog);
    if let Some(table) = &catalog.table {
        found.extend(problems(table, key_type, None));
    }
    // An outbox that schema 3 did not record is `foreign_outbox`'s.
    let recorded_outbox = catalog.version.is_some_and(|v| v >= 3);
    for side in side_tables(catalog, false) {
        if !side.have.is_empty() && (side.name != "outbox_messages" || recorded_outbox) {
            found.extend(side_table_problems(Some(side.since), side));
        }
    }
    found
}

/// The first claim's check on a connection: [`refuse`], and whether the
/// connection now counts as checked. Not while there is no table: the
/// claim fails on its own, and the table the application creates next is
/// checked at the next claim.
pub(crate) fn checked_at_claim(catalog: &Catalog, key_type: &str) -> Result<bool, InboxError> {
    refuse(catalog, key_type)?;
    Ok(catalog.table.is_some())
}

/// The columns of `inbox_attempts` the runtime reads and writes.
const ATTEMPTS_COLUMNS: [&str; 5] = [
    "consumer",
    "message_id",
    "failures",
    "last_error",
    "updated_at",
];

/// The columns of `outbox_messages` the runtime reads and writes, the
/// last one (`txid`) added by schema 5.
const OUTBOX_COLUMNS_5: [&str; 14] = [
    "seq",
    "id",
    "destination",
    "ordering_key",
    "payload",
    "headers",
    "created_at",
    "available_at",
    "attempts",
    "locked_by",
    "locked_until",
    "last_error",
    "dead_at",
    "txid",
];

/// The columns of `inbox_positions` the runtime reads and writes.
const POSITIONS_COLUMNS: [&str; 5] = [
    "consumer",
    "topic",
    "partition_id",
    "next_offset",
    "updated_at",
];

/// The tables beside `inbox_messages`, as the catalog found them;
/// `with_txid`: whether `outbox_messages` must have schema 5's `txid`.
fn side_tables(catalog: &Catalog, with_txid: bool) -> [SideTable<'_>; 3] {
    [
        SideTable {
            name: "inbox_attempts",
            since: 2,
            who: "handlers with `max_attempts` would fail",
            columns: &ATTEMPTS_COLUMNS,
            have: &catalog.attempts_columns,
            holds: "it holds only failure counts",
        },
        SideTable {
            name: "outbox_messages",
            since: 3,
            who: "`outbox::enqueue` and the relay would fail",
            columns: match with_txid {
                true => &OUTBOX_COLUMNS_5,
                false => &OUTBOX_COLUMNS_5[..OUTBOX_COLUMNS_5.len() - 1],
            },
            have: &catalog.outbox_columns,
            holds: "publish or move its pending messages first",
        },
        SideTable {
            name: "inbox_positions",
            since: 4,
            who: "the Kafka runner's handlers would fail",
            columns: &POSITIONS_COLUMNS,
            have: &catalog.positions_columns,
            holds: "it holds where each Kafka partition's consumer stands: recreate it with the same rows",
        },
    ]
}

/// A table of the schema beside `inbox_messages`, as the catalog found it.
struct SideTable<'a> {
    name: &'static str,
    /// The schema version that added it.
    since: u32,
    /// What fails without it.
    who: &'static str,
    columns: &'a [&'static str],
    /// The columns the catalog found, empty without the table.
    have: &'a [String],
    /// What to mind when recreating it.
    holds: &'static str,
}

/// Problems of an `outbox_messages` table that is there before the
/// upgrade to schema 3 creates it: an application's own outbox under the
/// same name, which `CREATE TABLE IF NOT EXISTS` would leave as it is.
/// Refused before any DDL runs (MySQL's DDL cannot be rolled back).
pub(crate) fn foreign_outbox(catalog: &Catalog) -> Vec<TableProblem> {
    if catalog.version.is_some_and(|v| v >= 3) || catalog.outbox_columns.is_empty() {
        return Vec::new();
    }
    let mut found = side_table_problems(
        Some(3),
        SideTable {
            name: "outbox_messages",
            since: 3,
            who: "",
            columns: &OUTBOX_COLUMNS_5[..OUTBOX_COLUMNS_5.len() - 1],
            have: &catalog.outbox_columns,
            holds: "it is not diesel-inbox's: rename the application's own table first",
        },
    );
    for problem in &mut found {
        problem.problem = format!(
            "a table `outbox_messages` exists that schema 3 did not create: {}",
            problem.problem
        );
    }
    found
}

fn side_table_problems(version: Option<u32>, table: SideTable<'_>) -> Vec<TableProblem> {
    if version.is_none_or(|v| v < table.since) {
        return Vec::new();
    }
    let name = table.name;
    if table.have.is_empty() {
        return vec![TableProblem::new(
            format!(
                "table `{name}` is missing, though the inbox is recorded as schema version {} or later: {}",
                table.since, table.who
            ),
            "run diesel_inbox::migrate (or `diesel-inbox migrate`), which creates it",
        )];
    }
    table
        .columns
        .iter()
        .filter(|c| !table.have.iter().any(|have| have == *c))
        .map(|c| match *c {
            // Added by a schema step: `migrate` adds it again.
            "txid" => TableProblem::new(
                format!("column `{c}` of `{name}` is missing"),
                "run diesel_inbox::migrate (or `diesel-inbox migrate`), which adds it",
            ),
            _ => TableProblem::new(
                format!("column `{c}` of `{name}` is missing"),
                format!(
                    "recreate `{name}` as diesel_inbox::ddl declares it ({})",
                    table.holds
                ),
            ),
        })
        .collect()
}

#[derive(Debug, Default)]
pub struct Table {
    /// Problems with the table object itself (a view, a non-transactional
    /// engine, an unlogged table), judged by the backend.
    pub(crate) problems: Vec<TableProblem>,
    pub(crate) columns: Vec<Column>,
    pub(crate) indexes: Vec<Index>,
    /// Foreign keys and check constraints: (what, name).
    pub(crate) constraints: Vec<(&'static str, String)>,
    /// Triggers and rules that run on INSERT: (what, name).
    pub(crate) insert_hooks: Vec<(&'static str, String)>,
}

#[derive(Debug)]
pub struct Column {
    pub(crate) name: String,
    /// NOT NULL without a default: an insert that does not name it fails
    /// (or, under MySQL's INSERT IGNORE, gets an implicit value).
    pub(crate) required: bool,
    pub(crate) has_default: bool,
    /// Why the column cannot hold every valid key and compare keys byte for
    /// byte (`None` when it can). Only judged for text columns the runtime
    /// stores keys in.
    pub(crate) key_problem: Option<String>,
}

#[derive(Debug)]
pub struct Index {
    pub(crate) name: String,
    pub(crate) primary: bool,
    pub(crate) unique: bool,
    pub(crate) columns: Vec<String>,
    /// Why the index does not cover whole values (a prefix, a predicate, an
    /// expression, a collation of its own), judged by the backend.
    pub(crate) problem: Option<String>,
}

const KEY_COLUMNS: [&str; 2] = ["consumer", "message_id"];

/// Every problem of `table`; empty when the runtime can use it. `key_type`
/// is the backend's column type for keys, named in fixes.
pub(crate) fn problems(table: &Table, key_type: &str, version: Option<u32>) -> Vec<TableProblem> {
    let mut found = table.problems.clone();
    let column = |name: &str| table.columns.iter().find(|c| c.name == name);
    let recreate = "recreate the table from diesel_inbox::ddl and copy its rows";

    // Schema 2's columns, on a table recorded as schema 2 or later (an
    // older table gets them from the upgrade).
    if version.is_some_and(|v| v >= 2) {
        for added in ["fingerprint", "result"] {
            if column(added).is_none() {
                found.push(TableProblem::new(
                    format!(
                        "column `{added}` is missing, though the table is recorded as schema \
                         version {}: fingerprinted or result-storing handlers would fail",
                        version.unwrap_or_default()
                    ),
                    "run diesel_inbox::migrate (or `diesel-inbox migrate`), which adds it",
                ));
            }
        }
    }

    for key in KEY_COLUMNS {
        match column(key) {
            None => found.push(TableProblem::new(
                format!("column `{key}` is missing"),
                recreate,
            )),
            Some(Column {
                key_problem: Some(why),
                ..
            }) => found.push(TableProblem::new(
                format!(
                    "column `{key}` {why}, so two different keys could count as one \
                     (a new message reported as a duplicate) or a key could be cut"
                ),
                format!("change `{key}` to {key_type}"),
            )),
            Some(_) => {}
        }
    }
    match column("received_at") {
        None => found.push(TableProblem::new(
            "column `received_at` is missing",
            recreate,
        )),
        Some(c) if !c.has_default => found.push(TableProblem::new(
            "column `received_at` has no default, and the claim does not set it",
            "give it the default of diesel_inbox::ddl (the current UTC time)",
        )),
        Some(_) => {}
    }
    for extra in &table.columns {
        if extra.required
            && !KEY_COLUMNS.contains(&extra.name.as_str())
            && extra.name != "received_at"
        {
            found.push(TableProblem::new(
                format!(
                    "column `{}` is NOT NULL without a default, and the claim does not set it",
                    extra.name
                ),
                format!(
                    "give `{}` a default, make it nullable, or drop it",
                    extra.name
                ),
            ));
        }
    }

    let primary = table.indexes.iter().find(|i| i.primary);
    match primary {
        None => found.push(TableProblem::new(
            "the table has no primary key, so nothing stops a redelivery from being applied again",
            "ALTER TABLE inbox_messages ADD PRIMARY KEY (consumer, message_id)",
        )),
        Some(pk) if pk.columns != KEY_COLUMNS => found.push(TableProblem::new(
            format!(
                "the primary key is ({}), not (consumer, message_id): {}",
                pk.columns.join(", "),
                if pk.columns.iter().all(|c| KEY_COLUMNS.contains(&c.as_str())) {
                    "one consumer's message would count as a duplicate for every other consumer"
                } else {
                    "redeliveries are not detected by (consumer, message_id)"
                }
            ),
            "make the primary key exactly (consumer, message_id), in that order",
        )),
        Some(Index {
            problem: Some(why), ..
        }) => found.push(TableProblem::new(
            format!("the primary key {why}, so different keys can collide"),
            "make the primary key exactly (consumer, message_id) over whole values",
        )),
        Some(_) => {}
    }
    for index in table.indexes.iter().filter(|i| i.unique && !i.primary) {
        found.push(TableProblem::new(
            format!(
                "unique index `{}` on ({}) adds a second uniqueness rule: a new message that \
                 breaks it fails its claim, or (MySQL INSERT IGNORE) is skipped as a duplicate",
                index.name,
                index.columns.join(", ")
            ),
            format!("drop the index `{}`", index.name),
        ));
    }
    let received_at_index = table.indexes.iter().any(|i| {
        i.columns.first().map(String::as_str) == Some("received_at") && i.problem.is_none()
    });
    if !received_at_index {
        found.push(TableProblem::new(
            "no index starts with `received_at`, so purging old rows scans the whole table",
            "CREATE INDEX inbox_messages_received_at ON inbox_messages (received_at)",
        ));
    }
    for (what, name) in &table.constraints {
        found.push(TableProblem::new(
            format!(
                "{what} `{name}` can refuse a claim: MySQL's INSERT IGNORE turns that into a \
                 silent skip (reported as a duplicate), other backends into a failed delivery"
            ),
            format!("drop the {what} `{name}`"),
        ));
    }
    for (what, name) in &table.insert_hooks {
        found.push(TableProblem::new(
            format!("{what} `{name}` runs on INSERT and can skip or change the claim"),
            format!("drop the {what} `{name}`"),
        ));
    }
    found
}

/// The marker that records the schema version with the table (PostgreSQL
/// and MySQL: the table comment), and its parser.
#[cfg(feature = "_server-backend")]
pub(crate) fn version_marker(version: u32) -> String {
    format!("diesel-inbox schema {version}")
}

/// The schema version a table comment written by `version_marker` holds.
#[cfg(feature = "_server-backend")]
pub(crate) fn parse_version_marker(text: &str) -> Option<u32> {
    text.trim()
        .strip_prefix("diesel-inbox schema ")?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> Table {
        let column = |name: &str| Column {
            name: name.to_string(),
            required: name != "received_at",
            has_default: name == "received_at",
            key_problem: None,
        };
        let index = |name: &str, primary: bool, columns: &[&str]| Index {
            name: name.to_string(),
            primary,
            unique: primary,
            columns: columns.iter().map(|c| c.to_string()).collect(),
            problem: None,
        };
        Table {
            columns: vec![
                column("consumer"),
                column("message_id"),
                column("received_at"),
            ],
            indexes: vec![
                index("pk", true, &["consumer", "message_id"]),
                index("inbox_messages_received_at", false, &["received_at"]),
            ],
            ..Table::default()
        }
    }

    #[test]
    fn the_table_of_the_ddl_has_no_problems() {
        assert_eq!(problems(&good(), "TEXT", Some(1)), vec![]);
    }

    #[test]
    fn each_deviation_is_one_problem_with_a_fix() {
        let mut table = good();
        table.indexes[0].columns = vec!["message_id".into()];
        table.columns[1].key_problem = Some("holds at most 36 bytes".into());
        table
            .constraints
            .push(("foreign key", "fk_consumer".into()));
        let found = problems(&table, "VARBINARY(255) NOT NULL", Some(1));
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found[0]
            .problem
            .contains("`message_id` holds at most 36 bytes"));
        assert_eq!(
            found[0].fix,
            "change `message_id` to VARBINARY(255) NOT NULL"
        );
        assert!(found[1]
            .problem
            .starts_with("the primary key is (message_id)"));
        assert!(found[1].problem.contains("every other consumer"));
        assert!(found[2].problem.starts_with("foreign key `fk_consumer`"));
    }

    #[test]
    #[cfg(feature = "_server-backend")]
    fn version_markers_round_trip() {
        assert_eq!(parse_version_marker(&version_marker(7)), Some(7));
        assert_eq!(parse_version_marker("orders of the day"), None);
    }
}
