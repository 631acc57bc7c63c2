//! The relay's claim ([`ClaimPlan`]), in the short transaction of a relay
//! step, written once for every backend:
//!
//! 1. **A look at the oldest live rows** (`window`: at most
//!    [`ClaimPlan::window_size`] rows, `seq`, key and due times only). Of
//!    each ordering key, its first row there is its oldest live row: a
//!    candidate if it is due and not held, and the key is settled either
//!    way. No per-row probe: a backlog of a few keys costs one short index
//!    range, not a lookup per waiting row.
//! 2. **Beyond the look**, only when it was full and found too few: due
//!    rows past it without a key, or of keys it did not see, whose key has
//!    no earlier live row past it (a live row before the look's end would
//!    have been in it). The probe looks downwards from the row, bounded by
//!    the look's end: the rows a held vacuum horizon keeps as dead tuples
//!    are below it.
//! 3. **The lock** of the candidates still due and not held, oldest first
//!    (`FOR UPDATE SKIP LOCKED`: a candidate another relay is claiming is
//!    skipped, with its key).
//! 4. **The followers**: the later live rows of the locked rows' keys, in
//!    order, locked, skipping rows another transaction locks (on
//!    MySQL/MariaDB a locking read would otherwise wait for any
//!    transaction that enqueued into the range and has not committed); of
//!    each key the claim takes those up to the first that is not due or is
//!    held.
//! 5. **The check for gaps** (only when it took followers): a plain read of
//!    those keys' live rows up to the last one taken. A key with a live
//!    row the followers skipped (locked by another relay, committed since)
//!    keeps only its oldest: the claim never takes a key's rows around one
//!    it does not hold.
//! 6. **The hold** of what it took, under the claim's token.
//!
//! A row that commits late with a lower `seq` than rows already looked at
//! is found by a later claim (the guide's "What enqueue order means").
//!
//! **The floor** (PostgreSQL, [`Floor`]): the look starts at the lowest
//! `seq`, and a long transaction keeps every row deleted since it began as
//! a dead tuple there, which each look would pass again. So each look
//! leaves a floor, and the next one reads only rows that can be live:
//! those the last look saw below the floor (a few, by key), those at or
//! past it, and those its snapshot could not see, found by the enqueuing
//! transaction's id (`txid`, schema 5): a transaction the snapshot did not
//! see has an id at or past the snapshot's `xmin`. So the look is the same
//! set of rows, in the same order, as a look from the lowest `seq`. A
//! long transaction that only reads (a report, `pg_dump`) has no id and
//! does not hold the `xmin` back; one that wrote does, and the look then
//! reads the rows enqueued since it began.

use super::stmt::{Bind, Stmt};
use super::Internals;
use diesel::sql_types::{BigInt, Binary, Integer, Nullable, Text};
use diesel::QueryableByName;
use std::collections::{HashMap, HashSet};

/// The claimed rows' columns (`o` is the outbox table).
const CLAIMED_COLUMNS: &str = "o.seq, o.id, o.destination, o.ordering_key, o.payload, o.headers, \
     o.attempts, o.created_at, o.available_at, o.locked_until";

/// A row the relay claimed.
#[derive(Debug, Clone, QueryableByName)]
#[doc(hidden)]
#[cfg_attr(not(feature = "async"), allow(dead_code))]
pub struct ClaimedRow {
    #[diesel(sql_type = BigInt)]
    pub seq: i64,
    #[diesel(sql_type = Text)]
    pub id: String,
    #[diesel(sql_type = Text)]
    pub destination: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub ordering_key: Option<String>,
    #[diesel(sql_type = Binary)]
    pub payload: Vec<u8>,
    #[diesel(sql_type = Nullable<Binary>)]
    pub headers: Option<Vec<u8>>,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = BigInt)]
    pub created_at: i64,
    #[diesel(sql_type = BigInt)]
    pub available_at: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub locked_until: Option<i64>,
    /// The claim's clock.
    #[diesel(sql_type = BigInt)]
    pub now_micros: i64,
}

/// The `seq` of a row.
#[derive(Debug, Clone, Copy, QueryableByName)]
pub(crate) struct SeqRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) seq: i64,
}

/// A live row as the claim's look sees it.
#[derive(Debug, Clone, QueryableByName)]
#[doc(hidden)]
pub struct WindowRow {
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Nullable<Text>)]
    ordering_key: Option<String>,
    #[diesel(sql_type = BigInt)]
    available_at: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    locked_until: Option<i64>,
    /// The statement's clock.
    #[diesel(sql_type = BigInt)]
    now_micros: i64,
    /// The statement's snapshot's `xmin` (PostgreSQL; NULL elsewhere).
    #[diesel(sql_type = Nullable<BigInt>)]
    xmin: Option<i64>,
    /// The session answering (`Internals::SESSION`; NULL elsewhere).
    #[diesel(sql_type = Nullable<Text>)]
    session: Option<String>,
}

/// Where a relay's next look starts (PostgreSQL; the module's "The
/// floor"): every row live then is one of `pinned`, at or past `from`, or
/// enqueued (or made live again) by a transaction whose id is at or past
/// `xmin`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[doc(hidden)]
pub struct Floor {
    /// The live rows the look read below `from`.
    pinned: Vec<i64>,
    /// `i64::MAX` when the look read every live row it could see.
    from: i64,
    /// The `xmin` of the look's snapshot (or of an earlier one).
    xmin: i64,
    /// The sessions that looked before this floor was made
    /// (`Internals::SESSION`), at most [`SESSIONS`], the latest last, as
    /// `,a,b,`. A session that is still alive has seen no crash of its
    /// server since it began (a crash restart ends every session), and no
    /// failover (a promoted standby is another server, with sessions of
    /// its own): rows that the server deleted and then has live again (a
    /// relay's deletes commit without waiting for the disk; an
    /// asynchronous standby misses them), with lower `seq`s and `txid`s
    /// than the floor, can only come with a session not listed. A look in
    /// such a session reads every row, as without a floor.
    sessions: String,
}

/// How many sessions a floor lists: a relay's pool, or the server
/// connections a transaction-mode proxy hands out.
const SESSIONS: usize = 32;

/// `sessions` (as [`Floor::sessions`] lists them) with `session` last.
fn listed(sessions: &str, session: &str) -> String {
    let mut all: Vec<&str> = sessions
        .split(',')
        .filter(|s| !s.is_empty() && *s != session)
        .collect();
    all.push(session);
    let keep = all.len().saturating_sub(SESSIONS);
    format!(",{},", all[keep..].join(","))
}

/// How many of the lowest live rows a floor names one by one, at most:
/// the delayed, backed-off or held rows at the bottom (and the rows their
/// keys hold back), which would otherwise hold the floor down.
const PINNED: usize = 32;

impl Floor {
    /// The floor a look leaves: `window` is the look's rows, oldest first
    /// (every live row its snapshot saw up to the last one); `before` the
    /// floor the look started from. It pins the rows at the bottom that
    /// stay (not due, held, or behind such a row of their key) and starts
    /// at the first other row: the rows this claim takes are past it, and
    /// the next look passes only their dead tuples. None where the
    /// backend has no snapshots to go by, or no snapshot was read yet.
    pub(crate) fn after(window: &[WindowRow], before: Option<&Floor>) -> Option<Floor> {
        let (xmin, sessions) = match window.first() {
            Some(row) => (
                row.xmin?,
                listed(
                    before.map_or("", |b| b.sessions.as_str()),
                    row.session.as_deref()?,
                ),
            ),
            // An earlier snapshot's `xmin` is at most this one's; the
            // session that saw nothing is not listed (it may be new).
            None => before.map(|b| (b.xmin, b.sessions.clone()))?,
        };
        let mut held_back = HashSet::new();
        let mut pinned = Vec::new();
        for row in window {
            let behind = row
                .ordering_key
                .as_deref()
                .is_some_and(|key| held_back.contains(key));
            let stays = behind || !due(row.available_at, row.locked_until, row.now_micros);
            if pinned.len() == PINNED || !stays {
                return Some(Floor {
                    pinned,
                    from: row.seq,
                    xmin,
                    sessions,
                });
            }
            if let Some(key) = row.ordering_key.as_deref() {
                held_back.insert(key);
            }
            pinned.push(row.seq);
        }
        // The look read every live row it could see, and each stays.
        Some(Floor {
            pinned,
            from: i64::MAX,
            xmin,
            sessions,
        })
    }
}

/// Whether a row could be claimed when it was read: due, and not held.
fn due(available_at: i64, locked_until: Option<i64>, now: i64) -> bool {
    available_at <= now && locked_until.is_none_or(|until| until < now)
}

/// A relay's claim: up to `limit` rows, held by `token` for `lease`
/// microseconds.
pub(crate) struct ClaimPlan {
    pub(crate) token: String,
    pub(crate) lease: i64,
    pub(crate) limit: i64,
    /// Where the look starts (none: at the lowest `seq`).
    pub(crate) floor: Option<Floor>,
}

/// What the look (and the scan beyond it) found.
pub(crate) struct Look {
    /// The candidates' `seq`s, oldest first.
    candidates: Vec<i64>,
    /// The keys the look saw (their oldest live row was in it).
    keys: Vec<String>,
    /// The look's last `seq`, when it was full (rows may lie beyond it).
    edge: Option<i64>,
}

impl Look {
    /// Adds the candidates found beyond the look.
    pub(crate) fn add(&mut self, rows: Vec<SeqRow>) {
        self.candidates.extend(rows.into_iter().map(|r| r.seq));
    }
}

/// The SQL condition "`o` is due and not held".
fn push_due<B: Internals>(stmt: Stmt) -> Stmt {
    stmt.sql("o.available_at <= ")
        .sql(B::NOW_MICROS)
        .sql(" AND (o.locked_until IS NULL OR o.locked_until < ")
        .sql(B::NOW_MICROS)
        .sql(")")
}

impl ClaimPlan {
    /// How many of the oldest live rows the look reads: four per row the
    /// claim may take, at least 400 and at most 20,000 (more keys than
    /// that at the bottom are found beyond the look; twenty per row cost a
    /// fifth of the relay's rate behind a backlog of one key per message).
    pub(crate) fn window_size(&self) -> i64 {
        (self.limit * 4).clamp(400, 20_000)
    }

    /// Step 1: the oldest live rows; from `floor` where there is one
    /// (PostgreSQL).
    pub(crate) fn window<B: Internals>(&self, floor: Option<&Floor>) -> Stmt {
        const ROW: &str = "SELECT o.seq, o.ordering_key, o.available_at, o.locked_until";
        const LIVE: &str = " FROM outbox_messages o WHERE o.dead_at IS NULL";
        let size = self.window_size();
        let head = |stmt: Stmt| {
            stmt.sql(", ")
                .sql(B::NOW_MICROS)
                .sql(" AS now_micros, ")
                .sql(B::SNAPSHOT_XMIN.unwrap_or("NULL"))
                .sql(" AS xmin, ")
                .sql(B::SESSION.unwrap_or("NULL"))
                .sql(" AS session")
        };
        let Some(floor) = floor.filter(|_| B::SNAPSHOT_XMIN.is_some() && B::SESSION.is_some())
        else {
            return head(Stmt::new().sql(ROW))
                .sql(LIVE)
                .sql(" ORDER BY o.seq LIMIT ")
                .bind(Bind::Big(size));
        };
        // The rows enqueued since the floor's snapshot (by the `txid`
        // index: a few, unless a transaction that wrote is still open),
        // the range from the floor (in `seq` order, limited: a short index
        // range) and the pinned rows: three disjoint parts, so UNION ALL
        // (no step to drop rows found twice). A fourth, the rest below the
        // floor, runs only in a session the floor does not list, or one
        // that cannot be named (a one-time filter: the condition reads no
        // column), so that a look after a crash or a failover reads every
        // row, as without a floor.
        let below = |stmt: Stmt| {
            let stmt = match floor.pinned.is_empty() {
                true => stmt,
                false => stmt.sql(" AND o.seq NOT IN ").seq_list(&floor.pinned),
            };
            match floor.from < i64::MAX {
                true => stmt.sql(" AND o.seq < ").bind(Bind::Big(floor.from)),
                false => stmt,
            }
        };
        let mut stmt = below(
            head(Stmt::new().sql("SELECT w.seq, w.ordering_key, w.available_at, w.locked_until"))
                .sql(" FROM (")
                .sql(ROW)
                .sql(LIVE)
                .sql(" AND o.txid >= ")
                .bind(Bind::Big(floor.xmin)),
        )
        .sql(" UNION ALL ")
        .sql(ROW)
        .sql(LIVE)
        .sql(" AND (o.txid < ")
        .bind(Bind::Big(floor.xmin))
        .sql(" OR o.txid IS NULL) AND COALESCE(strpos(CAST(")
        .bind(Bind::Text(floor.sessions.clone()))
        .sql(" AS TEXT), ',' || ")
        .sql(B::SESSION.unwrap_or("NULL"))
        .sql(" || ','), 0) = 0");
        stmt = below(stmt);
        if floor.from < i64::MAX {
            stmt = stmt
                .sql(" UNION ALL (")
                .sql(ROW)
                .sql(LIVE)
                .sql(" AND o.seq >= ")
                .bind(Bind::Big(floor.from))
                .sql(" ORDER BY o.seq LIMIT ")
                .bind(Bind::Big(size))
                .sql(")");
        }
        if !floor.pinned.is_empty() {
            stmt = stmt
                .sql(" UNION ALL ")
                .sql(ROW)
                .sql(LIVE)
                .sql(" AND o.seq IN ")
                .seq_list(&floor.pinned);
        }
        stmt.sql(") w ORDER BY w.seq LIMIT ").bind(Bind::Big(size))
    }

    /// The candidates of the look: each key's first row there and each row
    /// without a key, where due and not held.
    pub(crate) fn look(&self, window: &[WindowRow]) -> Look {
        let mut seen = HashSet::new();
        let mut candidates = Vec::new();
        for row in window {
            let first = match &row.ordering_key {
                Some(key) => seen.insert(key.as_str()),
                None => true,
            };
            if first
                && due(row.available_at, row.locked_until, row.now_micros)
                && (candidates.len() as i64) < self.limit
            {
                candidates.push(row.seq);
            }
        }
        let full = window.len() as i64 >= self.window_size();
        Look {
            candidates,
            keys: seen.into_iter().map(str::to_owned).collect(),
            edge: window.last().filter(|_| full).map(|r| r.seq),
        }
    }

    /// Step 2, when the look was full and found fewer than `limit`
    /// candidates.
    pub(crate) fn beyond<B: Internals>(&self, look: &Look) -> Option<Stmt> {
        let edge = look.edge?;
        let room = self.limit - look.candidates.len() as i64;
        if room <= 0 {
            return None;
        }
        let stmt = Stmt::new()
            .sql("SELECT o.seq FROM outbox_messages o WHERE o.dead_at IS NULL AND o.seq > ")
            .bind(Bind::Big(edge))
            .sql(" AND ");
        let mut stmt = push_due::<B>(stmt).sql(" AND (o.ordering_key IS NULL OR (");
        if !look.keys.is_empty() {
            let keys: Vec<&str> = look.keys.iter().map(String::as_str).collect();
            stmt = stmt
                .sql("o.ordering_key NOT IN ")
                .text_list(&keys)
                .sql(" AND ");
        }
        Some(
            stmt.sql(
                "(SELECT e.seq FROM outbox_messages e WHERE e.ordering_key = o.ordering_key \
                 AND e.seq > ",
            )
            .bind(Bind::Big(edge))
            .sql(
                " AND e.seq < o.seq AND e.dead_at IS NULL ORDER BY e.seq DESC LIMIT 1) IS NULL)) \
                 ORDER BY o.seq LIMIT ",
            )
            .bind(Bind::Big(room)),
        )
    }

    /// Step 3: the candidates, locked, where still live, due and not held;
    /// none without candidates.
    pub(crate) fn lock<B: Internals>(&self, look: &Look) -> Option<Stmt> {
        if look.candidates.is_empty() {
            return None;
        }
        let stmt = Stmt::new()
            .sql("SELECT ")
            .sql(CLAIMED_COLUMNS)
            .sql(", ")
            .sql(B::NOW_MICROS)
            .sql(" AS now_micros FROM outbox_messages o WHERE o.seq IN ")
            .seq_list(&look.candidates)
            .sql(" AND o.dead_at IS NULL AND ");
        Some(
            push_due::<B>(stmt)
                .sql(" ORDER BY o.seq LIMIT ")
                .bind(Bind::Big(self.limit))
                .sql(B::SKIP_LOCKED),
        )
    }

    /// Step 4, when the lock took rows with an ordering key and left room:
    /// the later live rows of those keys, oldest first, locked (skipping
    /// rows others lock).
    /// [`heads_and_due_followers`](Self::heads_and_due_followers) says which of them the claim takes.
    pub(crate) fn followers<B: Internals>(&self, heads: &[ClaimedRow]) -> Option<Stmt> {
        let room = self.limit - heads.len() as i64;
        let mut keys: Vec<&str> = heads
            .iter()
            .filter_map(|r| r.ordering_key.as_deref())
            .collect();
        let from = heads
            .iter()
            .filter(|r| r.ordering_key.is_some())
            .map(|r| r.seq)
            .min()?;
        if room <= 0 {
            return None;
        }
        keys.sort_unstable();
        keys.dedup();
        Some(
            Stmt::new()
                .sql("SELECT ")
                .sql(CLAIMED_COLUMNS)
                .sql(", ")
                .sql(B::NOW_MICROS)
                .sql(" AS now_micros FROM outbox_messages o WHERE o.dead_at IS NULL AND o.seq > ")
                .bind(Bind::Big(from))
                .sql(" AND o.ordering_key IN ")
                .text_list(&keys)
                .sql(" ORDER BY o.seq LIMIT ")
                .bind(Bind::Big(room))
                .sql(B::SKIP_LOCKED),
        )
    }

    /// Step 5, when `rows` holds followers: the live rows of their keys
    /// from the oldest taken to the last follower taken (a plain read).
    pub(crate) fn live_rows_in_taken_runs<B: Internals>(
        &self,
        rows: &[ClaimedRow],
    ) -> Option<Stmt> {
        let runs = runs(rows);
        let mut keys: Vec<&str> = runs
            .iter()
            .filter(|(_, run)| run.len() > 1)
            .map(|(key, _)| *key)
            .collect();
        if keys.is_empty() {
            return None;
        }
        keys.sort_unstable();
        let from = keys.iter().map(|k| runs[k][0]).min()?;
        let to = keys.iter().filter_map(|k| runs[k].last().copied()).max()?;
        Some(
            Stmt::new()
                .sql("SELECT o.seq, o.ordering_key, o.available_at, o.locked_until, ")
                .sql(B::NOW_MICROS)
                .sql(" AS now_micros, NULL AS xmin, NULL AS session FROM outbox_messages o WHERE o.dead_at IS NULL AND o.seq > ")
                .bind(Bind::Big(from))
                .sql(" AND o.seq <= ")
                .bind(Bind::Big(to))
                .sql(" AND o.ordering_key IN ")
                .text_list(&keys),
        )
    }

    /// `rows` without the followers of a key that has a live row in
    /// `live` between its oldest taken and its last taken that the claim
    /// did not take.
    pub(crate) fn contiguous(rows: Vec<ClaimedRow>, live: &[WindowRow]) -> Vec<ClaimedRow> {
        let runs = runs(&rows);
        let broken: HashSet<&str> = live
            .iter()
            .filter_map(|row| {
                let key = row.ordering_key.as_deref()?;
                let run = runs.get(key)?;
                let inside = row.seq > run[0] && row.seq <= *run.last()?;
                (inside && run.binary_search(&row.seq).is_err()).then_some(key)
            })
            .collect();
        if broken.is_empty() {
            return rows;
        }
        let broken: HashSet<String> = broken.into_iter().map(str::to_owned).collect();
        let mut first = HashSet::new();
        rows.into_iter()
            .filter(|row| match &row.ordering_key {
                Some(key) if broken.contains(key) => first.insert(key.clone()),
                _ => true,
            })
            .collect()
    }

    /// What the claim takes: `heads`, and of each of their keys the later
    /// rows of `followers` up to the first that is not due or is held (a
    /// delayed, backed-off or held message keeps its key's later ones
    /// back), oldest first.
    pub(crate) fn heads_and_due_followers(
        heads: Vec<ClaimedRow>,
        followers: Vec<ClaimedRow>,
    ) -> Vec<ClaimedRow> {
        let mut open: HashMap<String, i64> = heads
            .iter()
            .filter_map(|r| Some((r.ordering_key.clone()?, r.seq)))
            .collect();
        let mut rows = heads;
        for row in followers {
            let Some(key) = row.ordering_key.as_deref() else {
                continue;
            };
            match open.get(key) {
                Some(&oldest) if row.seq > oldest => {
                    if due(row.available_at, row.locked_until, row.now_micros) {
                        rows.push(row);
                    } else {
                        open.remove(key);
                    }
                }
                _ => {}
            }
        }
        rows.sort_unstable_by_key(|r| r.seq);
        rows
    }

    /// Step 6: the hold of `rows`; none when the claim took nothing.
    pub(crate) fn hold<B: Internals>(self, rows: &[ClaimedRow]) -> Option<Stmt> {
        let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
        (!seqs.is_empty()).then(|| {
            Stmt::new()
                .sql("UPDATE outbox_messages SET locked_by = ")
                .bind(Bind::Text(self.token))
                .sql(", locked_until = ")
                .sql(B::NOW_MICROS)
                .sql(" + ")
                .bind(Bind::Big(self.lease))
                .sql(" WHERE seq IN ")
                .seq_list(&seqs)
        })
    }
}

/// The `seq`s taken of each key, in order (`rows` oldest first).
fn runs(rows: &[ClaimedRow]) -> HashMap<&str, Vec<i64>> {
    let mut runs: HashMap<&str, Vec<i64>> = HashMap::new();
    for row in rows {
        if let Some(key) = row.ordering_key.as_deref() {
            runs.entry(key).or_default().push(row.seq);
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimed(seq: i64, key: &str) -> ClaimedRow {
        ClaimedRow {
            seq,
            id: format!("id-{seq}"),
            destination: "d".into(),
            ordering_key: Some(key.into()),
            payload: Vec::new(),
            headers: None,
            attempts: 0,
            created_at: 0,
            available_at: 0,
            locked_until: None,
            now_micros: 10,
        }
    }

    fn live(seq: i64, key: &str) -> WindowRow {
        WindowRow {
            seq,
            ordering_key: Some(key.into()),
            available_at: 0,
            locked_until: None,
            now_micros: 10,
            xmin: None,
            session: None,
        }
    }

    /// A look's row of `key` with the snapshot's `xmin` 70, due or not.
    fn seen(seq: i64, key: &str, due: bool) -> WindowRow {
        WindowRow {
            xmin: Some(70),
            session: Some("s1".into()),
            available_at: if due { 0 } else { 100 },
            ..live(seq, key)
        }
    }

    /// A floor pins the rows at the bottom that stay (not due, or behind
    /// such a row of their key) and starts at the first other row; a look
    /// that saw only such rows starts nowhere; an empty look keeps the
    /// snapshot it started from; without a snapshot there is no floor.
    #[test]
    fn a_look_leaves_a_floor() {
        let floor = |rows: &[WindowRow], before| Floor::after(rows, before).expect("a floor");
        let delayed = [seen(3, "a", false), seen(5, "a", true), seen(9, "b", true)];
        let first = floor(&delayed, None);
        assert_eq!(
            first,
            Floor {
                pinned: vec![3, 5],
                from: 9,
                xmin: 70,
                sessions: ",s1,".into()
            }
        );
        let due = [seen(3, "a", true), seen(5, "b", false)];
        assert_eq!(
            (floor(&due, None).pinned, floor(&due, None).from),
            (vec![], 3)
        );
        let stuck = [seen(3, "a", false)];
        assert_eq!(floor(&stuck, None).from, i64::MAX);
        let many: Vec<WindowRow> = (1..=100)
            .map(|i| seen(i, &format!("k{i}"), false))
            .collect();
        let most = floor(&many, None);
        assert_eq!(most.pinned, (1..=PINNED as i64).collect::<Vec<_>>());
        assert_eq!(most.from, PINNED as i64 + 1);
        assert_eq!(
            floor(&[], Some(&first)),
            Floor {
                pinned: vec![],
                from: i64::MAX,
                xmin: 70,
                sessions: ",s1,".into()
            }
        );
        assert_eq!(Floor::after(&[], None), None);
        assert_eq!(Floor::after(&[live(3, "a")], Some(&first)), None);
    }

    /// A floor lists the sessions that looked, the latest last, each once,
    /// at most `SESSIONS`; a look that saw nothing keeps the list it had.
    #[test]
    fn a_floor_lists_the_sessions_that_looked() {
        assert_eq!(listed("", "s1"), ",s1,");
        assert_eq!(listed(",s1,s2,", "s1"), ",s2,s1,");
        let many: String = (0..40).map(|i| format!(",s{i}")).collect::<String>() + ",";
        let kept = listed(&many, "new");
        assert_eq!(kept.split(',').filter(|s| !s.is_empty()).count(), SESSIONS);
        assert!(kept.ends_with(",new,") && !kept.contains(",s0,"), "{kept}");
        let first = Floor::after(&[seen(3, "a", true)], None).expect("a floor");
        assert_eq!(first.sessions, ",s1,");
        let other = WindowRow {
            session: Some("s2".into()),
            ..seen(5, "a", true)
        };
        let second = Floor::after(&[other], Some(&first)).expect("a floor");
        assert_eq!(second.sessions, ",s1,s2,");
        assert_eq!(
            Floor::after(&[], Some(&second)).expect("kept").sessions,
            ",s1,s2,"
        );
    }

    /// A key whose followers skipped a live row keeps only its oldest;
    /// a key without a gap keeps them all.
    #[test]
    fn a_gap_in_a_key_drops_its_followers() {
        let rows = vec![
            claimed(1, "a"),
            claimed(2, "b"),
            claimed(4, "a"),
            claimed(5, "b"),
            claimed(6, "a"),
        ];
        let seen = [
            live(2, "b"),
            live(3, "a"),
            live(4, "a"),
            live(5, "b"),
            live(6, "a"),
            live(9, "b"),
        ];
        let kept: Vec<i64> = ClaimPlan::contiguous(rows, &seen)
            .iter()
            .map(|r| r.seq)
            .collect();
        assert_eq!(kept, vec![1, 2, 5]);
    }

    /// The look takes each key's first row where due, and no later row of
    /// a key whose first is held or not due.
    #[test]
    fn the_look_takes_each_keys_first_row_when_due() {
        let plan = ClaimPlan {
            token: "t".into(),
            lease: 1,
            limit: 10,
            floor: None,
        };
        let mut held = live(2, "b");
        held.locked_until = Some(20);
        let mut later = live(4, "c");
        later.available_at = 11;
        let window = [
            live(1, "a"),
            held,
            live(3, "a"),
            later,
            live(5, "b"),
            live(6, "c"),
            live(7, "d"),
        ];
        let look = plan.look(&window);
        assert_eq!(look.candidates, vec![1, 7]);
        assert_eq!(look.edge, None);
    }
}
