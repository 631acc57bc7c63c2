/// Docs stay.
pub fn on_order_placed(
    conn: &mut PgConnection,
    msg: &OrderPlaced,
) -> Result<::diesel_inbox::Processed<i64>, AppError> {
    static __INBOX_HANDLER: ::diesel_inbox::__private::RegisteredHandler = ::diesel_inbox::__private::RegisteredHandler::new(
        "on_order_placed",
        ::core::concat!(::core::module_path!(), "::", "on_order_placed"),
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
            __inbox_error: &<Result<
                i64,
                AppError,
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
            |conn| -> Result<i64, AppError> {
                diesel::insert_into(orders::table).values(&msg.row).execute(conn)?;
                Ok(msg.total)
            },
        )
}
