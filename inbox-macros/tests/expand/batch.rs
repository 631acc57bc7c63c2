fn on_orders(
    conn: &mut PgConnection,
    orders: &[Order],
) -> QueryResult<::diesel_inbox::Batch<usize>> {
    ::diesel_inbox::__private::run_batch(
        conn,
        "on_orders",
        orders,
        |__inbox_message| {
            let order = __inbox_message;
            ::diesel_inbox::__private::owned_key(&(order.id.as_str()))
        },
        3u32,
        |conn, orders| -> QueryResult<usize> {
            diesel::insert_into(orders::table).values(rows(&orders)).execute(conn)
        },
        |__inbox_error| {
            #[allow(unused_imports)]
            use ::diesel_inbox::__private::{NotRetryable as _, ViaRetryableError as _};
            (&&::diesel_inbox::__private::Probe(__inbox_error)).classify()
        },
    )
}
