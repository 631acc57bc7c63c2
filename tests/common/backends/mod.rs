//! The backends under test, each implementing [`TestBackend`] once for
//! every test binary (the behaviour suites and the fault suite).
//!
//! [`TestBackend`]: super::backend::TestBackend

#[cfg(feature = "mysql")]
pub mod galera;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod pgbouncer;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
