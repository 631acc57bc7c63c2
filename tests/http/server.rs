//! The server process: an axum application with idempotent endpoints on
//! a deadpool pool of one backend, as a user writes it. It prints
//! `listening on <port>` and serves until it is killed.
//!
//! Knobs in the query string make a request do what a scenario needs:
//! `sleep_ms` (inside the body, before the commit), `panic`, `fail` (the
//! body's `Err`), `exit_after_commit` (SIGKILL after the commit, before
//! the response is sent), `wait_ms` (the front door's wait).

use axum::extract::{FromRequestParts, Query, State};
use axum::http::{header, request::Parts, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use diesel::sql_types::{BigInt, Text};
use diesel_async::pooled_connection::deadpool::{Pool, PoolError};
use diesel_async::pooled_connection::PoolableConnection;
use diesel_async::RunQueryDsl;
use diesel_inbox::http::{IdempotencyKey, Idempotent};
use diesel_inbox::{AsyncInboxConnection, InboxError};
use std::time::Duration;

/// The application's error: a database it cannot reach is `503`, the
/// body's refusal `400`, anything else `500`.
#[derive(Debug)]
pub enum AppError {
    Unavailable(String),
    Refused,
    Internal(String),
}

impl From<InboxError> for AppError {
    fn from(e: InboxError) -> Self {
        match e {
            InboxError::Database(e) => AppError::Unavailable(e.to_string()),
            InboxError::RetriesExhausted { source, .. } => {
                AppError::Unavailable(source.to_string())
            }
            other => AppError::Internal(other.to_string()),
        }
    }
}

impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        AppError::Unavailable(e.to_string())
    }
}

impl From<PoolError> for AppError {
    fn from(e: PoolError) -> Self {
        AppError::Unavailable(e.to_string())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            AppError::Unavailable(e) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
            AppError::Refused => {
                (StatusCode::BAD_REQUEST, "refused by the handler").into_response()
            }
            AppError::Internal(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
        }
    }
}

/// The application's own extractor: who is calling (`X-User`).
pub struct User(String);

impl<S: Send + Sync> FromRequestParts<S> for User {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        match parts.headers.get("x-user").and_then(|v| v.to_str().ok()) {
            Some(user) => Ok(User(user.to_owned())),
            None => Err((StatusCode::UNAUTHORIZED, "no X-User")),
        }
    }
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
pub struct Knobs {
    sleep_ms: u64,
    panic: bool,
    fail: bool,
    exit_after_commit: bool,
    wait_ms: Option<u64>,
    size: usize,
}

#[derive(serde::Deserialize, serde::Serialize)]
pub struct CreatePayment {
    amount: i64,
}

#[derive(diesel::QueryableByName)]
struct Inserted {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// What differs between the backends: the connection, the business
/// table and its insert (placeholders, `RETURNING`).
pub trait Db: Send + Sync + 'static {
    type Conn: AsyncInboxConnection + PoolableConnection + 'static;
    type Pool: Send + Sync + 'static;
    type Pooled: std::ops::DerefMut<Target = Self::Conn> + Send;
    const CREATE: &'static str;
    fn pool(url: String) -> Result<Self::Pool, String>;
    fn get(
        pool: &Self::Pool,
    ) -> impl std::future::Future<Output = Result<Self::Pooled, PoolError>> + Send;
    /// The routes, on this backend's handlers (axum checks a handler's
    /// future for `Send` on the concrete types).
    fn router(app: std::sync::Arc<App<Self>>) -> Router
    where
        Self: Sized;
    /// Inserts a business row; its id.
    fn insert<'a>(
        conn: &'a mut Self::Conn,
        scope: &'a str,
        key: &'a str,
        amount: i64,
    ) -> impl std::future::Future<Output = diesel::QueryResult<i64>> + Send + 'a;
    /// The connection's own lock wait setting, as the body sees it (the
    /// front door's bound must not reach the body): `SQL` selects it as
    /// `v`.
    const LOCK_WAIT: &'static str;
    fn lock_wait<'a>(
        conn: &'a mut Self::Conn,
    ) -> impl std::future::Future<Output = diesel::QueryResult<String>> + Send + 'a;
}

#[derive(diesel::QueryableByName)]
pub struct Setting {
    #[diesel(sql_type = Text)]
    v: String,
}

pub struct Sqlite;
#[cfg(feature = "postgres")]
pub struct Postgres;
#[cfg(feature = "mysql")]
pub struct Mysql;

macro_rules! db {
    ($db:ty, $conn:ty, $create:expr, $insert:expr, $lock_wait:expr) => {
        impl Db for $db {
            type Conn = $conn;
            const LOCK_WAIT: &'static str = $lock_wait;
            fn lock_wait<'a>(
                conn: &'a mut Self::Conn,
            ) -> impl std::future::Future<Output = diesel::QueryResult<String>> + Send + 'a {
                async move {
                    diesel::sql_query(Self::LOCK_WAIT)
                        .get_result::<Setting>(conn)
                        .await
                        .map(|row| row.v)
                }
            }
            type Pool = Pool<$conn>;
            type Pooled = diesel_async::pooled_connection::deadpool::Object<$conn>;
            const CREATE: &'static str = $create;
            fn pool(url: String) -> Result<Self::Pool, String> {
                crate::support::pools::deadpool(url, 8)
            }
            fn get(
                pool: &Self::Pool,
            ) -> impl std::future::Future<Output = Result<Self::Pooled, PoolError>> + Send {
                pool.get()
            }
            fn router(app: std::sync::Arc<App<Self>>) -> Router {
                Router::new()
                    .route("/payments", post(create_payment::<$db>))
                    .route("/blobs", post(create_blob::<$db>))
                    .route("/notes", post(create_note::<$db>))
                    .with_state(app)
            }
            fn insert<'a>(
                conn: &'a mut Self::Conn,
                scope: &'a str,
                key: &'a str,
                amount: i64,
            ) -> impl std::future::Future<Output = diesel::QueryResult<i64>> + Send + 'a {
                async move {
                    diesel::sql_query($insert)
                        .bind::<Text, _>(scope)
                        .bind::<Text, _>(key)
                        .bind::<BigInt, _>(amount)
                        .get_result::<Inserted>(conn)
                        .await
                        .map(|row| row.id)
                }
            }
        }
    };
}

db!(
    Sqlite,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    "CREATE TABLE IF NOT EXISTS http_payments (id INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT NULL, idem_key TEXT NOT NULL, amount BIGINT NOT NULL)",
    "INSERT INTO http_payments (scope, idem_key, amount) VALUES (?, ?, ?) RETURNING id",
    "SELECT 'busy timeout' AS v"
);
#[cfg(feature = "postgres")]
db!(
    Postgres,
    diesel_async::AsyncPgConnection,
    "CREATE TABLE IF NOT EXISTS http_payments (id BIGSERIAL PRIMARY KEY, scope TEXT NOT NULL, idem_key TEXT NOT NULL, amount BIGINT NOT NULL)",
    "INSERT INTO http_payments (scope, idem_key, amount) VALUES ($1, $2, $3) RETURNING id",
    "SELECT current_setting('lock_timeout') AS v"
);
#[cfg(feature = "mysql")]
db!(
    Mysql,
    diesel_async::AsyncMysqlConnection,
    "CREATE TABLE IF NOT EXISTS http_payments (id BIGINT AUTO_INCREMENT PRIMARY KEY, scope VARCHAR(255) NOT NULL, idem_key VARCHAR(255) NOT NULL, amount BIGINT NOT NULL)",
    "INSERT INTO http_payments (scope, idem_key, amount) VALUES (?, ?, ?) RETURNING id",
    "SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS CHAR) AS v"
);

pub struct App<D: Db> {
    pool: D::Pool,
}

/// Sends this process SIGKILL: the commit is done, the response is not
/// sent.
fn die() -> ! {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &std::process::id().to_string()])
        .status();
    std::thread::sleep(Duration::from_secs(10));
    unreachable!("SIGKILL did not arrive");
}

/// `POST /payments`: the contract's example, with the scenario's knobs.
async fn create_payment<D: Db>(
    State(app): State<std::sync::Arc<App<D>>>,
    key: IdempotencyKey,
    User(user): User,
    Query(knobs): Query<Knobs>,
    Json(req): Json<CreatePayment>,
) -> Result<Response, AppError> {
    let mut conn = D::get(&app.pool).await?;
    let mut idempotent = Idempotent::new("payments", &user, &key).fingerprint(&req);
    if let Some(ms) = knobs.wait_ms {
        idempotent = idempotent.wait(Duration::from_millis(ms));
    }
    let response = idempotent
        .run_async(&mut conn, async |conn| {
            let id = D::insert(conn, &user, key.as_str(), req.amount).await?;
            let lock_wait = D::lock_wait(conn).await?;
            if knobs.sleep_ms > 0 {
                tokio::time::sleep(Duration::from_millis(knobs.sleep_ms)).await;
            }
            if knobs.panic {
                panic!("the handler panicked on purpose");
            }
            if knobs.fail {
                return Err(AppError::Refused);
            }
            Ok::<_, AppError>((
                StatusCode::CREATED,
                [(header::LOCATION, format!("/payments/{}", id))],
                Json(serde_json::json!({ "id": id, "amount": req.amount, "lock_wait": lock_wait })),
            ))
        })
        .await?;
    if knobs.exit_after_commit {
        die();
    }
    Ok(response)
}

/// `POST /notes`: the key is optional (`Option<IdempotencyKey>`); without
/// one the body runs without deduplication.
async fn create_note<D: Db>(
    State(app): State<std::sync::Arc<App<D>>>,
    key: Option<IdempotencyKey>,
    User(user): User,
) -> Result<Response, AppError> {
    let mut conn = D::get(&app.pool).await?;
    let Some(key) = key else {
        let id = D::insert(&mut conn, &user, "no key", 1).await?;
        return Ok((StatusCode::CREATED, id.to_string()).into_response());
    };
    Idempotent::new("notes", &user, &key)
        .run_async(&mut conn, async |conn| {
            let id = D::insert(conn, &user, key.as_str(), 1).await?;
            Ok::<_, AppError>((StatusCode::CREATED, id.to_string()))
        })
        .await
}

/// `POST /blobs?size=N`: a binary body of `size` bytes (every byte value),
/// stored up to 1 KiB, with a header of its own stored too.
async fn create_blob<D: Db>(
    State(app): State<std::sync::Arc<App<D>>>,
    key: IdempotencyKey,
    User(user): User,
    Query(knobs): Query<Knobs>,
) -> Result<Response, AppError> {
    let mut conn = D::get(&app.pool).await?;
    Idempotent::new("blobs", &user, &key)
        .max_stored_body(1024)
        .store_headers([HeaderName::from_static("x-blob-id")])
        .run_async(&mut *conn, async |conn: &mut D::Conn| {
            let id = D::insert(conn, &user, key.as_str(), knobs.size as i64).await?;
            let bytes: Vec<u8> = (0..knobs.size).map(|i| (i * 7 % 256) as u8).collect();
            Ok::<_, AppError>((
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                    (header::ETAG, format!("\"blob-{}\"", id)),
                    (HeaderName::from_static("x-blob-id"), id.to_string()),
                    (HeaderName::from_static("x-not-stored"), "1".to_string()),
                ],
                bytes,
            ))
        })
        .await
}

/// Serves on a free loopback port until killed: the pool on `url`, the
/// tables migrated.
pub async fn serve<D: Db>(url: String) -> Result<(), String> {
    let pool = D::pool(url)?;
    {
        let mut conn = D::get(&pool).await.map_err(|e| e.to_string())?;
        diesel_inbox::migrate_async(&mut *conn)
            .await
            .map_err(|e| e.to_string())?;
        diesel_async::SimpleAsyncConnection::batch_execute(&mut *conn, D::CREATE)
            .await
            .map_err(|e| e.to_string())?;
    }
    let app = D::router(std::sync::Arc::new(App::<D> { pool }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    println!("listening on {port}");
    axum::serve(listener, app).await.map_err(|e| e.to_string())
}
