fn record<C>(&self, db: &mut C, event: Event) -> QueryResult<::inbox::Processed<()>>
where
    C: Connection,
{
    let __inbox_key = ::inbox::__private::owned_key(&(event.id));
    ::inbox::__private::run_once(
        db,
        "audit",
        &__inbox_key,
        |db| -> QueryResult<()> {
            self.sink.push(event);
            Ok(())
        },
    )
}
