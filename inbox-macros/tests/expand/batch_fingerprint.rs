async fn on_orders(
    conn: &mut AsyncPgConnection,
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
        .batch_fingerprint_or_error(
            orders,
            |__inbox_message| {
                let o = __inbox_message;
                {
                    #[allow(unused_imports)]
                    use ::diesel_inbox::__private::{ViaBytes as _, ViaSerialize as _};
                    ::diesel_inbox::__private::fingerprint(
                        (&&::diesel_inbox::__private::FingerprintProbe(
                            &(o.body.as_slice()),
                        ))
                            .__diesel_inbox_fingerprint(),
                    )
                }
            },
        )
        .run_batch_async(
            conn,
            orders,
            |__inbox_message| {
                let o = __inbox_message;
                ::diesel_inbox::__private::owned_key(&(o.id.as_str()))
            },
            async |conn, orders| -> QueryResult<usize> { Ok(orders.len()) },
        )
        .await
}
