//! A MariaDB Galera cluster as a test backend: `INBOX_TEST_GALERA_URLS`
//! holds one URL per node, comma-separated (`scripts/galera-cluster.sh
//! start` starts a 3-node cluster on loopback; `urls` prints them). Every
//! connection, sync or pooled, goes to the next node in turn, so the
//! handlers of one test run on all the nodes at once and only Galera's
//! certification settles which of two claims wins.
//!
//! The nodes run with `wsrep_sync_wait = 1`: a read waits until the node
//! has applied every write the cluster committed before it, so a test can
//! check on one node what a handler committed on another.

use crate::common::backend::TestBackend;
use crate::common::TestDb;

use diesel::connection::SimpleConnection;
use diesel::{Connection, MysqlConnection, RunQueryDsl};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

pub const URLS_VAR: &str = "INBOX_TEST_GALERA_URLS";
pub const GALERA_HINT: &str = "start a cluster with scripts/galera-cluster.sh start, set INBOX_TEST_GALERA_URLS=$(scripts/galera-cluster.sh urls) and run cargo test --all-features (bash .ci/run does both)";

/// The node URLs, or `None` after one line saying the tests were skipped.
pub fn nodes() -> Option<Vec<String>> {
    static NODES: OnceLock<Option<Vec<String>>> = OnceLock::new();
    NODES
        .get_or_init(|| {
            let list = crate::common::server_url(URLS_VAR, GALERA_HINT)?;
            Some(list.split(',').map(|u| u.trim().to_string()).collect())
        })
        .clone()
}

/// `url` (any node's, any database) moved to node `i`: the same user,
/// database and options on that node's host and port.
pub fn on_node(url: &str, i: usize) -> String {
    let nodes = nodes().expect("INBOX_TEST_GALERA_URLS");
    let authority = |u: &str| -> (usize, usize) {
        let start = u
            .find('@')
            .map_or_else(|| u.find("://").expect("a URL") + 3, |a| a + 1);
        let end = u[start..].find('/').map_or(u.len(), |e| start + e);
        (start, end)
    };
    let node = &nodes[i % nodes.len()];
    let (ns, ne) = authority(node);
    let (us, ue) = authority(url);
    format!("{}{}{}", &url[..us], &node[ns..ne], &url[ue..])
}

/// The node the next connection goes to.
fn next_node(url: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    on_node(url, NEXT.fetch_add(1, Ordering::Relaxed))
}

pub fn prepare(_test: &str) -> Option<TestDb> {
    static READY: OnceLock<Option<String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            let first = nodes()?.into_iter().next()?;
            let mut conn = open_node(&first);
            diesel_inbox::migrate(&mut conn).expect("migrate");
            conn.batch_execute(crate::common::EFFECTS_DDL)
                .expect("effects table");
            Some(first)
        })
        .clone()
        .map(TestDb::shared)
}

/// A connection to exactly the node `url` names.
pub fn open_node(url: &str) -> MysqlConnection {
    crate::common::connected(URLS_VAR, MysqlConnection::establish(url))
}

/// A connection to the next node in turn.
pub fn open(url: &str) -> MysqlConnection {
    open_node(&next_node(url))
}

/// An empty database of its own (created on one node, replicated to all).
pub fn fresh(test: &str) -> Option<TestDb> {
    let url = prepare(test)?.url.clone();
    let name = crate::common::unique_identifier(test);
    let db = super::mysql::create_database(&url, &name, open_node);
    // The DDL replicates in total order, but a node may not have applied
    // it yet when the creating node returns; a read on each node waits
    // (wsrep_sync_wait) until it has.
    for i in 0..nodes()?.len() {
        let seen: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!(
            "(SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = '{name}')"
        )))
        .get_result(&mut open_node(&on_node(&url, i)))
        .expect("the database on every node");
        assert_eq!(seen, 1, "database {name} on node {}", i + 1);
    }
    Some(TestDb::owned(db, super::mysql::discard))
}

/// A Galera cluster, connections spread over its nodes.
pub struct Galera;

#[cfg(feature = "async")]
type AsyncMysql = diesel_async::AsyncMysqlConnection;

impl TestBackend for Galera {
    type Conn = MysqlConnection;
    #[cfg(feature = "async")]
    type AsyncConn = AsyncMysql;
    #[cfg(feature = "async")]
    type Pool = diesel_async::pooled_connection::deadpool::Pool<AsyncMysql>;
    #[cfg(feature = "async")]
    type Pooled = diesel_async::pooled_connection::deadpool::Object<AsyncMysql>;

    fn prepare(test: &str) -> Option<TestDb> {
        prepare(test)
    }

    /// A read of the inbox on every node, which waits (`wsrep_sync_wait =
    /// 1`) until the node has applied every write the cluster committed
    /// before it.
    fn settle(url: &str) {
        for i in 0..nodes().map_or(0, |n| n.len()) {
            open_node(&on_node(url, i))
                .batch_execute("SELECT COUNT(*) FROM inbox_messages")
                .expect("a read on every node");
        }
    }

    fn fresh(test: &str) -> Option<TestDb> {
        fresh(test)
    }

    fn open(url: &str) -> MysqlConnection {
        open(url)
    }

    /// Each new pooled connection goes to the next node.
    #[cfg(feature = "async")]
    fn pool(url: &str) -> Self::Pool {
        use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
        let mut config = ManagerConfig::<AsyncMysql>::default();
        config.custom_setup = Box::new(|url| {
            let url = next_node(url);
            Box::pin(
                async move { <AsyncMysql as diesel_async::AsyncConnection>::establish(&url).await },
            )
        });
        let manager = AsyncDieselConnectionManager::<AsyncMysql>::new_with_config(url, config);
        diesel_async::pooled_connection::deadpool::Pool::builder(manager)
            .max_size(16)
            .build()
            .expect("a pool")
    }

    #[cfg(feature = "async")]
    async fn pooled(pool: &Self::Pool) -> Self::Pooled {
        pool.get().await.expect("a pooled connection")
    }

    fn fail_transiently(conn: &mut MysqlConnection) -> diesel::QueryResult<()> {
        conn.batch_execute(super::mysql::FAIL_TRANSIENTLY)
    }

    #[cfg(feature = "async")]
    async fn fail_transiently_async(conn: &mut AsyncMysql) -> diesel::QueryResult<()> {
        diesel_async::SimpleAsyncConnection::batch_execute(conn, super::mysql::FAIL_TRANSIENTLY)
            .await
    }

    /// MariaDB checks foreign keys at once, never at COMMIT.
    const DEFERRED_FK: Option<(&'static str, &'static str)> = None;
    const MULTI_MASTER: bool = true;

    crate::data_access!(MysqlConnection);
}
