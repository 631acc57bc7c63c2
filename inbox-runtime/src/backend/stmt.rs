//! A statement built at run time from static SQL pieces and bind
//! parameters ([`Stmt`]): the outbox's and the stream positions'
//! statements, written once for every backend.

use super::Internals;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, Binary, Bool, HasSqlType, Integer, Nullable, Text, Untyped};

/// A bind parameter of a [`Stmt`].
#[derive(Debug, Clone)]
pub(crate) enum Bind {
    Text(String),
    Big(i64),
    Int(i32),
    /// A nullable text (an ordering key).
    MaybeText(Option<String>),
    Bytes(Vec<u8>),
    /// Nullable bytes (stored headers).
    MaybeBytes(Option<Vec<u8>>),
    Bool(bool),
}

#[derive(Debug, Clone)]
enum Part {
    Sql(std::borrow::Cow<'static, str>),
    Bind(Bind),
}

/// One of the relay's and the operations' statements as static SQL pieces
/// and bind parameters in order: the placeholders are the backend's own
/// (`$n` or `?`). Statements with an `IN` list of varying length are never
/// cached; on PostgreSQL none is (a proxy in transaction mode shares
/// prepared statements' names between clients:
/// `Internals::CACHE_SIDE_STATEMENTS`). The enqueue, on the handler's
/// path, is a statement of its own ([`Enqueue`]).
#[derive(Debug, Clone)]
pub(crate) struct Stmt {
    parts: Vec<Part>,
    cache: bool,
}

impl Stmt {
    /// An empty statement, cacheable until a part says otherwise.
    pub(crate) fn new() -> Self {
        Stmt {
            parts: Vec::new(),
            cache: true,
        }
    }

    /// Appends static SQL text (never a caller's value: that is a bind).
    pub(crate) fn sql(mut self, sql: &'static str) -> Self {
        self.parts.push(Part::Sql(sql.into()));
        self
    }

    /// Appends a bind parameter (the backend's placeholder).
    pub(crate) fn bind(mut self, value: Bind) -> Self {
        self.parts.push(Part::Bind(value));
        self
    }

    /// `(v1, v2, ...)` of `seqs`; the statement is not cached.
    pub(crate) fn seq_list(self, seqs: &[i64]) -> Self {
        self.list(seqs.iter().map(|seq| Bind::Big(*seq)))
    }

    /// `(v1, v2, ...)` of `texts`; the statement is not cached.
    pub(crate) fn text_list(self, texts: &[&str]) -> Self {
        self.list(texts.iter().map(|text| Bind::Text((*text).to_owned())))
    }

    fn list(mut self, values: impl Iterator<Item = Bind>) -> Self {
        self.cache = false;
        self = self.sql("(");
        for (i, value) in values.enumerate() {
            if i > 0 {
                self = self.sql(", ");
            }
            self = self.bind(value);
        }
        self.sql(")")
    }
}

impl<B> QueryFragment<B> for Stmt
where
    B: Internals
        + HasSqlType<Text>
        + HasSqlType<BigInt>
        + HasSqlType<Integer>
        + HasSqlType<Binary>
        + HasSqlType<Bool>,
    String: ToSql<Text, B>,
    i64: ToSql<BigInt, B>,
    i32: ToSql<Integer, B>,
    Vec<u8>: ToSql<Binary, B>,
    bool: ToSql<Bool, B>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, B>) -> QueryResult<()> {
        if !self.cache || !B::CACHE_SIDE_STATEMENTS {
            out.unsafe_to_cache_prepared();
        }
        for part in &self.parts {
            match part {
                Part::Sql(sql) => out.push_sql(sql),
                Part::Bind(Bind::Text(v)) => out.push_bind_param::<Text, String>(v)?,
                Part::Bind(Bind::Big(v)) => out.push_bind_param::<BigInt, i64>(v)?,
                Part::Bind(Bind::Int(v)) => out.push_bind_param::<Integer, i32>(v)?,
                Part::Bind(Bind::MaybeText(v)) => {
                    out.push_bind_param::<Nullable<Text>, Option<String>>(v)?
                }
                Part::Bind(Bind::Bytes(v)) => out.push_bind_param::<Binary, Vec<u8>>(v)?,
                Part::Bind(Bind::MaybeBytes(v)) => {
                    out.push_bind_param::<Nullable<Binary>, Option<Vec<u8>>>(v)?
                }
                Part::Bind(Bind::Bool(v)) => out.push_bind_param::<Bool, bool>(v)?,
            }
        }
        Ok(())
    }
}

impl QueryId for Stmt {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for Stmt {
    type SqlType = Untyped;
}

impl<Conn> diesel::RunQueryDsl<Conn> for Stmt {}
