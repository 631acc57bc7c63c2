fn on_orders(
    conn: &mut PgConnection,
    orders: &[Order],
) -> QueryResult<::diesel_inbox::Batch<usize>> {
    static __INBOX_HANDLER: ::diesel_inbox::__private::RegisteredHandler = ::diesel_inbox::__private::RegisteredHandler::new(
        "on_orders",
        ::core::concat!(::core::module_path!(), "::", "on_orders"),
        ::core::file!(),
        ::core::line!(),
        false,
    );
    ::diesel_inbox::__private::inventory::submit!(
        ::diesel_inbox::__private::Registration(& __INBOX_HANDLER)
    );
    ::diesel_inbox::__private::Inbox::consumer(&&__INBOX_HANDLER)
        .retries(3u32)
        .classify(|
            __inbox_error: &<QueryResult<
                usize,
            > as ::diesel_inbox::__private::ResultParts>::Error|
        {
            #[allow(unused_imports)]
            use ::diesel_inbox::__private::{ViaRetryableError as _, ViaStatements as _};
            (&&::diesel_inbox::__private::Probe(__inbox_error))
                .__diesel_inbox_error_class()
        })
        .run_batch(
            conn,
            orders,
            |__inbox_message| {
                let order = __inbox_message;
                ::diesel_inbox::__private::owned_key(&(order.id.as_str()))
            },
            |conn, orders| -> QueryResult<usize> {
                diesel::insert_into(orders::table).values(rows(&orders)).execute(conn)
            },
        )
}
