CREATE OR REPLACE FUNCTION diesel_inbox_refuse(refusal TEXT) RETURNS INTEGER
LANGUAGE plpgsql VOLATILE AS $diesel_inbox$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'P0001',
        MESSAGE = 'diesel-inbox: ' || refusal,
        HINT = 'diesel-inbox refused a statement that a connection proxy mixed up with another client''s: '
            || 'a proxy in transaction mode (PgBouncer before 1.21) shares prepared statements between clients. '
            || 'Use session pooling, PgBouncer 1.21 or later with max_prepared_statements, '
            || 'or disable diesel''s statement cache (CacheSize::Disabled).';
END
$diesel_inbox$;
