//! The stream positions of the Kafka runner (`inbox_positions`): the
//! fence's locked read and its move, and the positions' listing. They run
//! as [`Op::Fence`](super::outbox::Op::Fence) and
//! [`Op::Positions`](super::outbox::Op::Positions), through the outbox
//! statements' executor.

use super::stmt::{Bind, Stmt};
use super::Internals;
use crate::fence::{Fenced, Position};
use diesel::result::QueryResult;
use diesel::sql_types::{BigInt, Integer, Text};
use diesel::QueryableByName;

/// A stored stream position.
#[derive(Debug, Clone, QueryableByName)]
#[doc(hidden)]
pub struct PositionRow {
    #[diesel(sql_type = Text)]
    pub consumer: String,
    #[diesel(sql_type = Text)]
    pub topic: String,
    #[diesel(sql_type = Integer)]
    pub partition_id: i32,
    #[diesel(sql_type = BigInt)]
    pub next_offset: i64,
    #[diesel(sql_type = BigInt)]
    pub updated_at: i64,
    #[diesel(sql_type = BigInt)]
    pub now: i64,
}

/// A stored offset a fence read, with its partition.
#[derive(Debug, Clone, Copy, QueryableByName)]
pub(crate) struct OffsetRow {
    #[diesel(sql_type = Integer)]
    partition_id: i32,
    #[diesel(sql_type = BigInt)]
    next_offset: i64,
}

/// Per topic of `positions`, the moves to make when the fence admits the
/// stored positions. `positions` are a call's, in their order (a batch's:
/// one per partition); the refusal names the first refused one by its
/// index there.
pub(super) fn fence(consumer: String, positions: Vec<Position>) -> Vec<Move> {
    let mut topics: Vec<Move> = Vec::new();
    for (index, position) in positions.into_iter().enumerate() {
        match topics.iter_mut().find(|m| m.topic == position.topic) {
            Some(topic) => topic.positions.push((index, position)),
            None => topics.push(Move {
                consumer: consumer.clone(),
                topic: position.topic.clone(),
                positions: vec![(index, position)],
            }),
        }
    }
    for topic in &mut topics {
        topic.positions.sort_by_key(|(_, p)| p.partition);
    }
    topics
}

/// `$1, $2, ..`: the partitions of `positions`.
fn in_list(mut stmt: Stmt, positions: &[(usize, Position)]) -> Stmt {
    for (n, (_, position)) in positions.iter().enumerate() {
        if n > 0 {
            stmt = stmt.sql(", ");
        }
        stmt = stmt.bind(Bind::Int(position.partition));
    }
    stmt
}

/// The stored positions, of `consumer` or of all.
pub(super) fn list<B: Internals>(consumer: Option<String>) -> Stmt {
    let all = Stmt::new()
        .sql("SELECT consumer, topic, partition_id, next_offset, updated_at, ")
        .sql(B::NOW_MICROS)
        .sql(" AS now FROM inbox_positions");
    let some = match consumer {
        Some(consumer) => all.sql(" WHERE consumer = ").bind(Bind::Text(consumer)),
        None => all,
    };
    some.sql(" ORDER BY consumer, topic, partition_id")
}

/// The moves of one topic's stream positions a fence makes when its
/// guard admits the stored ones.
pub(super) struct Move {
    consumer: String,
    topic: String,
    /// The positions, with their index in the call, by partition.
    positions: Vec<(usize, Position)>,
}

/// The statements that move a topic's positions: the update of the stored
/// ones and the insert of the new ones (either may be absent), each with
/// the rows it must write.
pub(super) type Writes = Vec<(Stmt, usize)>;

impl Move {
    /// The select of the stored positions (locked, in partition order).
    pub(super) fn select<B: Internals>(&self) -> Stmt {
        let select = Stmt::new()
            .sql("SELECT partition_id, next_offset FROM inbox_positions WHERE consumer = ")
            .bind(Bind::Text(self.consumer.clone()))
            .sql(" AND topic = ")
            .bind(Bind::Text(self.topic.clone()))
            .sql(" AND partition_id IN (");
        in_list(select, &self.positions)
            .sql(") ORDER BY partition_id")
            .sql(B::LOCK_ROW)
    }

    /// Where the backend can ([`Internals::FENCE_IN_ONE`]): one statement
    /// that moves every stored position the guard admits and returns the
    /// moved ones' partitions (the common case, a runner's own partitions:
    /// all of them, in one round trip), with the transaction's idle bound
    /// in its condition. What it did not move (no row yet, or a refused
    /// one) goes through [`without`](Self::without), [`select`](Self::select)
    /// and [`of`](Self::of).
    pub(super) fn admitted<B: Internals>(&self) -> Option<Stmt> {
        if !B::FENCE_IN_ONE {
            return None;
        }
        let mut update = Stmt::new()
            .sql("UPDATE inbox_positions AS p SET next_offset = v.next_offset, updated_at = ")
            .sql(B::NOW_MICROS)
            .sql(" FROM (VALUES ");
        for (n, (_, position)) in self.positions.iter().enumerate() {
            update = update
                .sql(if n == 0 { "(" } else { ", (" })
                .bind(Bind::Int(position.partition))
                .sql(", ")
                .bind(Bind::Big(position.floor.unwrap_or(position.offset)))
                .sql(", ")
                .bind(Bind::Big(position.offset))
                .sql(", ")
                .bind(Bind::Big(position.last + 1))
                .sql(")");
        }
        update = update
            .sql(
                ") AS v (partition_id, low, high, next_offset) \
                 WHERE p.partition_id = v.partition_id AND p.next_offset BETWEEN v.low AND v.high \
                 AND p.consumer = ",
            )
            .bind(Bind::Text(self.consumer.clone()))
            .sql(" AND p.topic = ")
            .bind(Bind::Text(self.topic.clone()));
        if let Some(bound) = B::FENCED_IDLE_LIMIT {
            update = update.sql(" AND ").sql(bound).sql(" IS NOT NULL");
        }
        Some(update.sql(" RETURNING p.partition_id, p.next_offset"))
    }

    /// The positions [`admitted`](Self::admitted) did not move; `None`
    /// when it moved them all.
    pub(super) fn without(mut self, moved: &[OffsetRow]) -> Option<Move> {
        self.positions
            .retain(|(_, p)| !moved.iter().any(|row| row.partition_id == p.partition));
        (!self.positions.is_empty()).then_some(self)
    }

    /// The statements that move the positions from `stored` (an update of
    /// the stored ones, an insert of the others), or the refusal of the
    /// first position the guard refuses.
    pub(super) fn of<B: Internals>(self, stored: &[OffsetRow]) -> Result<Writes, Fenced> {
        let stored_of = |partition: i32| {
            stored
                .iter()
                .find(|row| row.partition_id == partition)
                .map(|row| row.next_offset)
        };
        let mut refused: Option<(usize, i64)> = None;
        for (index, position) in &self.positions {
            let found = stored_of(position.partition);
            if !position.admits(found) && refused.is_none_or(|(first, _)| *index < first) {
                refused = Some((*index, found.unwrap_or_default()));
            }
        }
        if let Some((index, stored)) = refused {
            return Err(Fenced::Refused { index, stored });
        }
        let (known, new): (Vec<_>, Vec<_>) = self
            .positions
            .into_iter()
            .partition(|(_, p)| stored_of(p.partition).is_some());
        let mut writes = Writes::new();
        if !known.is_empty() {
            let mut update =
                Stmt::new().sql("UPDATE inbox_positions SET next_offset = CASE partition_id");
            for (_, position) in &known {
                update = update
                    .sql(" WHEN ")
                    .bind(Bind::Int(position.partition))
                    .sql(" THEN ")
                    .bind(Bind::Big(position.last + 1));
            }
            update = update
                .sql(" END, updated_at = ")
                .sql(B::NOW_MICROS)
                .sql(" WHERE consumer = ")
                .bind(Bind::Text(self.consumer.clone()))
                .sql(" AND topic = ")
                .bind(Bind::Text(self.topic.clone()))
                .sql(" AND partition_id IN (");
            writes.push((in_list(update, &known).sql(")"), known.len()));
        }
        if !new.is_empty() {
            let mut insert = Stmt::new().sql(
                "INSERT INTO inbox_positions (consumer, topic, partition_id, next_offset, updated_at) VALUES ",
            );
            for (n, (_, position)) in new.iter().enumerate() {
                insert = insert
                    .sql(if n == 0 { "(" } else { ", (" })
                    .bind(Bind::Text(self.consumer.clone()))
                    .sql(", ")
                    .bind(Bind::Text(self.topic.clone()))
                    .sql(", ")
                    .bind(Bind::Int(position.partition))
                    .sql(", ")
                    .bind(Bind::Big(position.last + 1))
                    .sql(", ")
                    .sql(B::NOW_MICROS)
                    .sql(")");
            }
            writes.push((insert, new.len()));
        }
        Ok(writes)
    }
}

/// A fence's write must have written each row it read (or inserted):
/// `expected` of them.
pub(super) fn moved(written: usize, expected: usize) -> QueryResult<()> {
    match written == expected {
        true => Ok(()),
        false => Err(diesel::result::Error::QueryBuilderError(
            format!("moving the stream positions wrote {written} rows, not {expected}").into(),
        )),
    }
}
