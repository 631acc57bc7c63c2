fn charge(
    conn: &mut PgConnection,
    msg: &Payment,
) -> QueryResult<::diesel_inbox::Stored<i64>> {
    static __INBOX_HANDLER: ::diesel_inbox::__private::RegisteredHandler = ::diesel_inbox::__private::RegisteredHandler::new(
        "charge",
        ::core::concat!(::core::module_path!(), "::", "charge"),
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
                i64,
            > as ::diesel_inbox::__private::ResultParts>::Error|
        {
            #[allow(unused_imports)]
            use ::diesel_inbox::__private::{ViaRetryableError as _, ViaStatements as _};
            (&&::diesel_inbox::__private::Probe(__inbox_error))
                .__diesel_inbox_error_class()
        })
        .store_result()
        .run(conn, &(msg.id), |conn| -> QueryResult<i64> { Ok(msg.amount) })
}
