#[allow(unused_variables)]
#[deny(unsafe_code)]
fn handle(
    conn: &mut PgConnection,
    msg: &Msg,
) -> QueryResult<::diesel_inbox::Processed<()>> {
    static __INBOX_HANDLER: ::diesel_inbox::__private::RegisteredHandler = ::diesel_inbox::__private::RegisteredHandler::new(
        "handle",
        ::core::concat!(::core::module_path!(), "::", "handle"),
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
                (),
            > as ::diesel_inbox::__private::ResultParts>::Error|
        {
            #[allow(unused_imports)]
            use ::diesel_inbox::__private::{ViaRetryableError as _, ViaStatements as _};
            (&&::diesel_inbox::__private::Probe(__inbox_error))
                .__diesel_inbox_error_class()
        })
        .run(
            conn,
            &(msg.id),
            |conn| -> QueryResult<()> {
                let unused = 1;
                Ok(())
            },
        )
}
