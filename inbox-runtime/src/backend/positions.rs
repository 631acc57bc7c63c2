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

/// The stored offset a fence read.
#[derive(Debug, Clone, Copy, QueryableByName)]
pub(crate) struct OffsetRow {
    #[diesel(sql_type = BigInt)]
    next_offset: i64,
}

/// The select of the stored position of `consumer` on `position`'s
/// partition (locked), and the move to make when the fence admits it.
pub(super) fn fence<B: Internals>(consumer: String, position: Position) -> (Stmt, Move) {
    (
        Stmt::new()
            .sql("SELECT next_offset FROM inbox_positions WHERE consumer = ")
            .bind(Bind::Text(consumer.clone()))
            .sql(" AND topic = ")
            .bind(Bind::Text(position.topic.clone()))
            .sql(" AND partition_id = ")
            .bind(Bind::Int(position.partition))
            .sql(B::LOCK_ROW),
        Move { consumer, position },
    )
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

/// The move of a stream position a fence makes when its guard admits the
/// stored one.
pub(super) struct Move {
    consumer: String,
    position: Position,
}

impl Move {
    /// The statement that moves the position from `stored` (inserts it
    /// when there is none), or the refusal of the op's `index`th position.
    pub(super) fn of<B: Internals>(
        self,
        stored: &[OffsetRow],
        index: usize,
    ) -> Result<Stmt, Fenced> {
        let stored = stored.first().map(|row| row.next_offset);
        if !self.position.admits(stored) {
            return Err(Fenced::Refused {
                index,
                stored: stored.unwrap_or_default(),
            });
        }
        let next = self.position.last + 1;
        Ok(match stored {
            None => Stmt::new()
                .sql("INSERT INTO inbox_positions (consumer, topic, partition_id, next_offset, updated_at) VALUES (")
                .bind(Bind::Text(self.consumer))
                .sql(", ")
                .bind(Bind::Text(self.position.topic))
                .sql(", ")
                .bind(Bind::Int(self.position.partition))
                .sql(", ")
                .bind(Bind::Big(next))
                .sql(", ")
                .sql(B::NOW_MICROS)
                .sql(")"),
            Some(_) => Stmt::new()
                .sql("UPDATE inbox_positions SET next_offset = ")
                .bind(Bind::Big(next))
                .sql(", updated_at = ")
                .sql(B::NOW_MICROS)
                .sql(" WHERE consumer = ")
                .bind(Bind::Text(self.consumer))
                .sql(" AND topic = ")
                .bind(Bind::Text(self.position.topic))
                .sql(" AND partition_id = ")
                .bind(Bind::Int(self.position.partition)),
        })
    }
}

/// A fence's move must have written the one row it read (or inserted).
pub(super) fn moved(written: usize) -> QueryResult<()> {
    match written {
        1 => Ok(()),
        n => Err(diesel::result::Error::QueryBuilderError(
            format!("moving the stream position wrote {n} rows, not 1").into(),
        )),
    }
}
