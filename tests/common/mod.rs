//! Shared by the backend test files: everything in `basics.rs`, the
//! test-backend trait, the handlers and the behaviour tests, generic over
//! it.
#![allow(dead_code, unused_macros)]

mod basics;
pub use basics::*;

pub mod async_suite;
pub mod backend;
pub mod backends;
pub mod checks;
pub mod contract;
pub mod handlers;
pub mod modes;
pub mod operations;
pub mod schema;
pub mod sync_suite;
