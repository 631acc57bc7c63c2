/// Docs stay.
pub fn on_order_placed(
    conn: &mut PgConnection,
    msg: &OrderPlaced,
) -> Result<::diesel_inbox::Processed<i64>, AppError> {
    ::diesel_inbox::__private::run(
        conn,
        "on_order_placed",
        &(msg.id),
        3u32,
        |conn| -> Result<i64, AppError> {
            diesel::insert_into(orders::table).values(&msg.row).execute(conn)?;
            Ok(msg.total)
        },
        |__inbox_error| {
            #[allow(unused_imports)]
            use ::diesel_inbox::__private::{NotRetryable as _, ViaRetryableError as _};
            (&&::diesel_inbox::__private::Probe(__inbox_error)).classify()
        },
    )
}
