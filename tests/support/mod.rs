//! What every test binary shares: the business table, unique run ids, test
//! databases, server variables, captured `tracing` events and the
//! side-by-side runner of the scenario harnesses (`basics.rs`), the
//! handlers' error type (`errors.rs`), a TCP proxy that can refuse or stall
//! connections (`proxy.rs`), async pools (`pools.rs`), a relay in a task
//! (`relay.rs`) and the database servers of tests that make databases of
//! their own (`servers.rs`). The behaviour suites' handlers and tests are `common/`,
//! which only the backend binaries include, so that its handlers do not
//! join the registry of consumers of the binaries that check it.
#![allow(dead_code, unused_imports, unused_macros)]

mod basics;
pub use basics::*;

pub mod errors;
pub use errors::AppError;
pub mod pools;
pub mod proxy;
pub mod relay;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod servers;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use servers::{on, Server};
