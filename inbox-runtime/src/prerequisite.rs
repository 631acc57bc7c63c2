//! The durability prerequisites of the guarantee as a server reports them:
//! a commit acknowledged to the broker must survive a crash of the server
//! and a failover to a replica. Each backend judges its own settings
//! (`backend::shape::Dialect::durability`); the catalog query reads them,
//! [`warn_once`] logs a problem once per process, and
//! [`durability`](crate::durability) lists them all for `diesel-inbox doctor`.

use std::fmt;

/// How a prerequisite stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// The server keeps what it acknowledged.
    Ok,
    /// The server may lose an acknowledged commit: a message acked to its
    /// broker whose business change and inbox row are gone, or an
    /// enqueued message that is never published.
    Warn,
    /// The connection cannot read it (a privilege it lacks, a managed
    /// service that hides it): check it by hand.
    Unknown,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "WARN",
            Verdict::Unknown => "unknown",
        })
    }
}

/// One durability prerequisite of the guarantee (docs/guide/guarantees.md),
/// read from the server: [`durability`](crate::durability) lists them.
///
/// ```
/// use diesel_inbox::{Prerequisite, Verdict};
///
/// let fsync = Prerequisite::new("fsync", "on", Verdict::Ok, "every commit is on disk before it is acknowledged", None);
/// assert_eq!(fsync.to_string(), "ok       fsync = on: every commit is on disk before it is acknowledged");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Prerequisite {
    /// The setting or state: `fsync`, `synchronous_commit`, `replication`.
    pub name: String,
    /// What the server reports for it.
    pub value: String,
    /// Whether it keeps acknowledged commits.
    pub verdict: Verdict,
    /// What the value means for an acknowledged commit.
    pub detail: String,
    /// How to fix it, when the verdict is not [`Verdict::Ok`].
    pub fix: Option<String>,
}

impl Prerequisite {
    /// A prerequisite as read.
    pub fn new(
        name: impl Into<String>,
        value: impl Into<String>,
        verdict: Verdict,
        detail: impl Into<String>,
        fix: Option<String>,
    ) -> Self {
        Prerequisite {
            name: name.into(),
            value: value.into(),
            verdict,
            detail: detail.into(),
            fix,
        }
    }

    /// A setting at a value that keeps acknowledged commits.
    #[cfg_attr(not(feature = "_server-backend"), allow(dead_code))]
    pub(crate) fn ok(name: &str, value: &str, detail: impl Into<String>) -> Self {
        Prerequisite::new(name, value, Verdict::Ok, detail, None)
    }

    /// A setting at a value that may lose acknowledged commits.
    #[cfg_attr(not(feature = "_server-backend"), allow(dead_code))]
    pub(crate) fn warn(
        name: &str,
        value: &str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Prerequisite::new(name, value, Verdict::Warn, detail, Some(fix.into()))
    }

    /// A state the connection cannot read.
    #[cfg_attr(not(feature = "_any-backend"), allow(dead_code))]
    pub(crate) fn unknown(
        name: &str,
        value: &str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Prerequisite::new(name, value, Verdict::Unknown, detail, Some(fix.into()))
    }
}

impl fmt::Display for Prerequisite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<8} {} = {}: {}",
            self.verdict.to_string(),
            self.name,
            self.value,
            self.detail
        )?;
        if let Some(fix) = &self.fix {
            write!(f, "; fix: {fix}")?;
        }
        Ok(())
    }
}

/// Says once per process, as a WARN, that the server may lose what it
/// acknowledged (read with every catalog query: `migrate`, and each
/// connection's first claim): once per setting and value.
#[cfg(feature = "_any-backend")]
pub(crate) fn warn_once(prerequisite: &Prerequisite) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if prerequisite.verdict != Verdict::Warn {
        return;
    }
    let said = format!("{}={}", prerequisite.name, prerequisite.value);
    {
        let mut seen = SAID
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.contains(&said) {
            return;
        }
        seen.push(said);
    }
    tracing::warn!(
        target: crate::target::TARGET,
        setting = prerequisite.name.as_str(),
        value = prerequisite.value.as_str(),
        fix = prerequisite.fix.as_deref().unwrap_or(""),
        "diesel-inbox: the database server may lose committed transactions: {}",
        prerequisite.detail
    );
}
