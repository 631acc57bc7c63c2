/// Docs stay.
#[allow(unused_variables, clippy::diverging_sub_expression)]
pub fn handle(
    conn: &mut PgConnection,
    msg: &Msg,
) -> QueryResult<::diesel_inbox::Processed<u32>> {
    ::core::unreachable!("`#[idempotent]` refused this handler at compile time")
}
::core::compile_error! {
    "`message` in `key` is not a parameter of `handle`; its parameters are `msg`"
}
