//! Shared by the backend test files: everything in `tests/support`, the
//! test-backend trait, the handlers and the behaviour tests, generic over
//! it.
#![allow(dead_code, unused_macros)]

pub use crate::support::*;

pub mod async_suite;
pub mod backend;
pub mod backends;
pub mod cancel;
pub mod checks;
pub mod contract;
#[cfg(feature = "mysql")]
pub mod galera_hot;
pub mod handlers;
pub mod modes;
pub mod operations;
pub mod schema;
pub mod sync_suite;
