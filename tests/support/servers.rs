//! The database servers on which tests make databases of their own, and a
//! sync connection to either kind (`on!`).

/// A database server of the tests: its URL is in [`Server::var`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "mysql")]
    Mariadb,
}

impl Server {
    /// The variable naming the server's test database.
    pub fn var(self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Server::Postgres => "INBOX_TEST_POSTGRES_URL",
            #[cfg(feature = "mysql")]
            Server::Mariadb => "INBOX_TEST_MYSQL_URL",
        }
    }

    /// Drops database `name`, the sessions on it too.
    pub fn drop_statement(self, name: &str) -> String {
        match self {
            #[cfg(feature = "postgres")]
            Server::Postgres => format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            #[cfg(feature = "mysql")]
            Server::Mariadb => format!("DROP DATABASE IF EXISTS {name}"),
        }
    }
}

/// Runs `$body` with `$conn` a sync connection of `$server`'s kind to
/// `$url`: a panic if it cannot connect, or with `try` first, an early
/// `Err(String)` from the enclosing function.
macro_rules! on {
    (try $server:expr, $url:expr, |$conn:ident| $body:expr) => {
        $crate::support::on!(@ $server, $url, |$conn| $body, |e| return Err(format!("the server: {e}")))
    };
    (@ $server:expr, $url:expr, |$conn:ident| $body:expr, |$e:ident| $failed:expr) => {
        match $server {
            #[cfg(feature = "postgres")]
            $crate::support::Server::Postgres => {
                let mut $conn = match <diesel::PgConnection as diesel::Connection>::establish($url) {
                    Ok(conn) => conn,
                    Err($e) => $failed,
                };
                $body
            }
            #[cfg(feature = "mysql")]
            $crate::support::Server::Mariadb => {
                let mut $conn = match <diesel::MysqlConnection as diesel::Connection>::establish($url) {
                    Ok(conn) => conn,
                    Err($e) => $failed,
                };
                $body
            }
        }
    };
    ($server:expr, $url:expr, |$conn:ident| $body:expr) => {
        $crate::support::on!(@ $server, $url, |$conn| $body, |e| panic!("the server: {e}"))
    };
}
pub(crate) use on;
