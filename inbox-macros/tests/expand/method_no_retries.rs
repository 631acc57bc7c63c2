fn record<C>(&self, db: &mut C, event: Event) -> QueryResult<::inbox::Processed<()>>
where
    C: Connection,
{
    static __INBOX_HANDLER: ::inbox::__private::RegisteredHandler = ::inbox::__private::RegisteredHandler::new(
        "audit",
        ::core::concat!(::core::module_path!(), "::", "record"),
        ::core::file!(),
        ::core::line!(),
        false,
    );
    ::inbox::__private::inventory::submit!(
        ::inbox::__private::Registration(& __INBOX_HANDLER)
    );
    let __inbox_key = ::inbox::__private::owned_key(&(event.id));
    ::inbox::__private::Inbox::consumer(&&__INBOX_HANDLER)
        .run_once(
            db,
            &__inbox_key,
            |db| -> QueryResult<()> {
                self.sink.push(event);
                Ok(())
            },
        )
}
