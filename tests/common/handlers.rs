//! The handlers of the behaviour contract, once as sync `fn`s and once as
//! `async fn`s, each generic over the backend. The two modules hold the
//! same handlers under the same consumer names (`shared`: one test binary
//! holds both).

use super::backend::{Msg, TestBackend};
pub use crate::support::AppError;
use diesel_inbox::idempotent;

/// What the `store_result` handlers return and the inbox stores.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub key: String,
    pub amount: i64,
    pub note: String,
}

/// How a `flaky` delivery ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fail {
    No,
    Error,
    Panic,
}

/// `Receipt` of a later release, with a field the stored JSON lacks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReceiptV2 {
    pub key: String,
    pub amount: i64,
    pub currency: String,
}

pub mod sync {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::mpsc::Sender;
    use std::time::Duration;

    #[idempotent(key = "msg.key", consumer = "payments", shared)]
    pub fn apply_payment<B: TestBackend>(conn: &mut B::Conn, msg: &Msg) -> Result<i64, AppError> {
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        Ok(msg.amount)
    }

    #[idempotent(key = "msg.key", consumer = "rejecting", shared)]
    pub fn write_then_reject<B: TestBackend>(
        conn: &mut B::Conn,
        msg: &Msg,
    ) -> Result<(), AppError> {
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        Err(AppError::Rejected)
    }

    #[idempotent(key = "msg.key", consumer = "rejecting", shared)]
    pub fn write_then_accept<B: TestBackend>(
        conn: &mut B::Conn,
        msg: &Msg,
    ) -> Result<(), AppError> {
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        Ok(())
    }

    #[idempotent(key = "msg.key", consumer = "panicking", shared)]
    pub fn write_then_panic<B: TestBackend>(conn: &mut B::Conn, msg: &Msg) -> Result<(), AppError> {
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        panic!("handler bug after a write");
    }

    #[idempotent(key = "msg.key", consumer = "ledger", shared)]
    pub fn ledger<B: TestBackend>(conn: &mut B::Conn, msg: &Msg) -> Result<i64, AppError> {
        B::write_effect(conn, &msg.run, &format!("ledger/{}", msg.key), msg.amount)?;
        Ok(msg.amount)
    }

    #[idempotent(key = "msg.key", consumer = "mailer", shared)]
    pub fn mailer<B: TestBackend>(conn: &mut B::Conn, msg: &Msg) -> Result<i64, AppError> {
        B::write_effect(conn, &msg.run, &format!("mailer/{}", msg.key), msg.amount)?;
        Ok(msg.amount)
    }

    #[idempotent(key = "id", consumer = "int-keys", shared)]
    pub fn by_int<B: TestBackend>(conn: &mut B::Conn, run: &str, id: i64) -> Result<i64, AppError> {
        B::write_effect(conn, run, &id.to_string(), id)?;
        Ok(id)
    }

    #[idempotent(key = "id", consumer = "str-keys", shared)]
    pub fn by_str<B: TestBackend>(conn: &mut B::Conn, run: &str, id: &str) -> Result<(), AppError> {
        B::write_effect(conn, run, id, 0)?;
        Ok(())
    }

    #[idempotent(key = "id", consumer = "uuid-keys", shared)]
    pub fn by_uuid<B: TestBackend>(
        conn: &mut B::Conn,
        run: &str,
        id: uuid::Uuid,
    ) -> Result<(), AppError> {
        B::write_effect(conn, run, &id.to_string(), 0)?;
        Ok(())
    }

    /// Claims, tells the test, holds the transaction open, then commits or fails.
    #[idempotent(key = "msg.key", consumer = "slow", shared)]
    pub fn slow<B: TestBackend>(
        conn: &mut B::Conn,
        msg: &Msg,
        claimed: &Sender<()>,
        fail: bool,
    ) -> Result<(), AppError> {
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        let _ = claimed.send(());
        std::thread::sleep(Duration::from_millis(300));
        if fail {
            return Err(AppError::Rejected);
        }
        Ok(())
    }

    #[idempotent(
        batch = "msgs",
        key = "|m| m.key.as_str()",
        consumer = "batch-payments",
        shared
    )]
    pub fn apply_batch<B: TestBackend>(
        conn: &mut B::Conn,
        msgs: &[Msg],
    ) -> Result<usize, AppError> {
        Ok(B::write_effects(conn, &msgs)?)
    }

    #[idempotent(
        batch = "msgs",
        key = "|m| m.key.as_str()",
        consumer = "batch-payments",
        shared
    )]
    pub fn apply_batch_then_reject<B: TestBackend>(
        conn: &mut B::Conn,
        msgs: &[Msg],
    ) -> Result<(), AppError> {
        B::write_effects(conn, &msgs)?;
        Err(AppError::Rejected)
    }

    /// Writes, then on its first run executes a statement that fails
    /// transiently; the error type knows nothing of retries.
    #[idempotent(key = "msg.key", consumer = "transient-once", shared)]
    pub fn transient_once<B: TestBackend>(
        conn: &mut B::Conn,
        msg: &Msg,
        runs: &AtomicU32,
    ) -> Result<(), AppError> {
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        if runs.fetch_add(1, Ordering::SeqCst) == 0 {
            B::fail_transiently(conn)?;
        }
        Ok(())
    }

    /// The content is the amount: a redelivery with another amount reuses
    /// the key.
    #[idempotent(
        key = "msg.key",
        consumer = "fingerprinted",
        shared,
        fingerprint = "msg.amount.to_be_bytes()"
    )]
    pub fn fingerprinted<B: TestBackend>(conn: &mut B::Conn, msg: &Msg) -> Result<i64, AppError> {
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        Ok(msg.amount)
    }

    /// The same consumer without a fingerprint (as before the upgrade).
    #[idempotent(key = "msg.key", consumer = "fingerprinted", shared)]
    pub fn unfingerprinted<B: TestBackend>(conn: &mut B::Conn, msg: &Msg) -> Result<i64, AppError> {
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        Ok(msg.amount)
    }

    /// Each message's content, `(key, amount)`, fingerprinted as JSON.
    #[idempotent(
        batch = "msgs",
        key = "|m| m.key.as_str()",
        fingerprint = "|m| (m.key.as_str(), m.amount)",
        consumer = "fingerprinted-batch",
        shared
    )]
    pub fn fingerprinted_batch<B: TestBackend>(
        conn: &mut B::Conn,
        msgs: &[Msg],
    ) -> Result<usize, AppError> {
        Ok(B::write_effects(conn, &msgs)?)
    }

    #[idempotent(
        key = "msg.key",
        consumer = "receipts",
        shared,
        store_result,
        fingerprint = "msg.amount.to_string()"
    )]
    pub fn receipt<B: TestBackend>(conn: &mut B::Conn, msg: &Msg) -> Result<Receipt, AppError> {
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        Ok(Receipt {
            key: msg.key.clone(),
            amount: msg.amount,
            note: format!("paid {}", msg.amount),
        })
    }

    /// `receipt` after its success type changed incompatibly.
    #[idempotent(key = "msg.key", consumer = "receipts", shared, store_result)]
    pub fn receipt_v2<B: TestBackend>(
        conn: &mut B::Conn,
        msg: &Msg,
    ) -> Result<ReceiptV2, AppError> {
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        Ok(ReceiptV2 {
            key: msg.key.clone(),
            amount: msg.amount,
            currency: "EUR".into(),
        })
    }

    /// The receipts' consumer without `store_result`.
    #[idempotent(key = "msg.key", consumer = "receipts", shared)]
    pub fn receipt_unstored<B: TestBackend>(
        conn: &mut B::Conn,
        msg: &Msg,
    ) -> Result<i64, AppError> {
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        Ok(msg.amount)
    }

    /// Writes, then succeeds, fails or panics as told; counts its runs.
    #[idempotent(key = "msg.key", consumer = "flaky", shared, max_attempts = 3)]
    pub fn flaky<B: TestBackend>(
        conn: &mut B::Conn,
        msg: &Msg,
        runs: &std::sync::atomic::AtomicU32,
        fail: Fail,
    ) -> Result<i64, AppError> {
        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        B::write_effect(conn, &msg.run, &msg.key, msg.amount)?;
        match fail {
            Fail::No => Ok(msg.amount),
            Fail::Error => Err(AppError::Rejected),
            Fail::Panic => panic!("poison message"),
        }
    }
}

#[cfg(feature = "async")]
pub mod asynchronous {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::mpsc::Sender;
    use std::time::Duration;

    #[idempotent(key = "msg.key", consumer = "payments", shared)]
    pub async fn apply_payment<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<i64, AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        Ok(msg.amount)
    }

    #[idempotent(key = "msg.key", consumer = "rejecting", shared)]
    pub async fn write_then_reject<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<(), AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        Err(AppError::Rejected)
    }

    #[idempotent(key = "msg.key", consumer = "rejecting", shared)]
    pub async fn write_then_accept<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<(), AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        Ok(())
    }

    #[idempotent(key = "msg.key", consumer = "panicking", shared)]
    pub async fn write_then_panic<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<(), AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        panic!("handler bug after a write");
    }

    /// Writes, then waits far longer than any test: a caller's timeout
    /// cancels it mid-body.
    #[idempotent(key = "msg.key", consumer = "stalling", shared)]
    pub async fn write_then_stall<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<i64, AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        tokio::time::sleep(Duration::from_secs(600)).await;
        Ok(msg.amount)
    }

    /// Says it runs (the claim is done), then stalls before writing
    /// anything: a timeout cancels it after the claim, before the body's
    /// first statement.
    #[idempotent(key = "msg.key", consumer = "stalling", shared)]
    pub async fn stall_then_write<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
        claimed: &std::sync::atomic::AtomicBool,
    ) -> Result<i64, AppError> {
        claimed.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(600)).await;
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        Ok(msg.amount)
    }

    /// The redelivery of what `write_then_stall` was cancelled in.
    #[idempotent(key = "msg.key", consumer = "stalling", shared)]
    pub async fn write_at_once<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<i64, AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        Ok(msg.amount)
    }

    #[idempotent(key = "msg.key", consumer = "ledger", shared)]
    pub async fn ledger<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<i64, AppError> {
        B::write_effect_async(conn, &msg.run, &format!("ledger/{}", msg.key), msg.amount).await?;
        Ok(msg.amount)
    }

    #[idempotent(key = "msg.key", consumer = "mailer", shared)]
    pub async fn mailer<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<i64, AppError> {
        B::write_effect_async(conn, &msg.run, &format!("mailer/{}", msg.key), msg.amount).await?;
        Ok(msg.amount)
    }

    #[idempotent(key = "id", consumer = "int-keys", shared)]
    pub async fn by_int<B: TestBackend>(
        conn: &mut B::AsyncConn,
        run: &str,
        id: i64,
    ) -> Result<i64, AppError> {
        B::write_effect_async(conn, run, &id.to_string(), id).await?;
        Ok(id)
    }

    #[idempotent(key = "id", consumer = "str-keys", shared)]
    pub async fn by_str<B: TestBackend>(
        conn: &mut B::AsyncConn,
        run: &str,
        id: &str,
    ) -> Result<(), AppError> {
        B::write_effect_async(conn, run, id, 0).await?;
        Ok(())
    }

    #[idempotent(key = "id", consumer = "uuid-keys", shared)]
    pub async fn by_uuid<B: TestBackend>(
        conn: &mut B::AsyncConn,
        run: &str,
        id: uuid::Uuid,
    ) -> Result<(), AppError> {
        B::write_effect_async(conn, run, &id.to_string(), 0).await?;
        Ok(())
    }

    /// Claims, tells the test, holds the transaction open (an async sleep:
    /// the executor thread is free), then commits or fails.
    #[idempotent(key = "msg.key", consumer = "slow", shared)]
    pub async fn slow<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
        claimed: &Sender<()>,
        fail: bool,
    ) -> Result<(), AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        let _ = claimed.send(());
        tokio::time::sleep(Duration::from_millis(300)).await;
        if fail {
            return Err(AppError::Rejected);
        }
        Ok(())
    }

    #[idempotent(
        batch = "msgs",
        key = "|m| m.key.as_str()",
        consumer = "batch-payments",
        shared
    )]
    pub async fn apply_batch<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msgs: &[Msg],
    ) -> Result<usize, AppError> {
        Ok(B::write_effects_async(conn, &msgs).await?)
    }

    #[idempotent(
        batch = "msgs",
        key = "|m| m.key.as_str()",
        consumer = "batch-payments",
        shared
    )]
    pub async fn apply_batch_then_reject<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msgs: &[Msg],
    ) -> Result<(), AppError> {
        B::write_effects_async(conn, &msgs).await?;
        Err(AppError::Rejected)
    }

    #[idempotent(key = "msg.key", consumer = "transient-once", shared)]
    pub async fn transient_once<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
        runs: &AtomicU32,
    ) -> Result<(), AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        if runs.fetch_add(1, Ordering::SeqCst) == 0 {
            B::fail_transiently_async(conn).await?;
        }
        Ok(())
    }

    /// The content is the amount: a redelivery with another amount reuses
    /// the key.
    #[idempotent(
        key = "msg.key",
        consumer = "fingerprinted",
        shared,
        fingerprint = "msg.amount.to_be_bytes()"
    )]
    pub async fn fingerprinted<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<i64, AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        Ok(msg.amount)
    }

    /// The same consumer without a fingerprint (as before the upgrade).
    #[idempotent(key = "msg.key", consumer = "fingerprinted", shared)]
    pub async fn unfingerprinted<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<i64, AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        Ok(msg.amount)
    }

    /// Each message's content, `(key, amount)`, fingerprinted as JSON.
    #[idempotent(
        batch = "msgs",
        key = "|m| m.key.as_str()",
        fingerprint = "|m| (m.key.as_str(), m.amount)",
        consumer = "fingerprinted-batch",
        shared
    )]
    pub async fn fingerprinted_batch<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msgs: &[Msg],
    ) -> Result<usize, AppError> {
        Ok(B::write_effects_async(conn, &msgs).await?)
    }

    #[idempotent(
        key = "msg.key",
        consumer = "receipts",
        shared,
        store_result,
        fingerprint = "msg.amount.to_string()"
    )]
    pub async fn receipt<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<Receipt, AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        Ok(Receipt {
            key: msg.key.clone(),
            amount: msg.amount,
            note: format!("paid {}", msg.amount),
        })
    }

    /// `receipt` after its success type changed incompatibly.
    #[idempotent(key = "msg.key", consumer = "receipts", shared, store_result)]
    pub async fn receipt_v2<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<ReceiptV2, AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        Ok(ReceiptV2 {
            key: msg.key.clone(),
            amount: msg.amount,
            currency: "EUR".into(),
        })
    }

    /// The receipts' consumer without `store_result`.
    #[idempotent(key = "msg.key", consumer = "receipts", shared)]
    pub async fn receipt_unstored<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
    ) -> Result<i64, AppError> {
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        Ok(msg.amount)
    }

    /// Writes, then succeeds, fails or panics as told; counts its runs.
    #[idempotent(key = "msg.key", consumer = "flaky", shared, max_attempts = 3)]
    pub async fn flaky<B: TestBackend>(
        conn: &mut B::AsyncConn,
        msg: &Msg,
        runs: &std::sync::atomic::AtomicU32,
        fail: Fail,
    ) -> Result<i64, AppError> {
        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        B::write_effect_async(conn, &msg.run, &msg.key, msg.amount).await?;
        match fail {
            Fail::No => Ok(msg.amount),
            Fail::Error => Err(AppError::Rejected),
            Fail::Panic => panic!("poison message"),
        }
    }
}
