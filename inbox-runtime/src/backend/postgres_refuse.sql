CREATE OR REPLACE FUNCTION diesel_inbox_refuse() RETURNS INTEGER
LANGUAGE plpgsql STABLE AS $diesel_inbox$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'P0001',
        MESSAGE = 'diesel-inbox: a statement of diesel-inbox ran with another statement''s parameters, '
            || 'or another statement ran under its prepared name',
        HINT = 'a connection proxy in transaction mode (PgBouncer before 1.21) shares prepared statements '
            || 'between clients: use session pooling, PgBouncer 1.21 or later with max_prepared_statements, '
            || 'or disable diesel''s statement cache (CacheSize::Disabled)';
END
$diesel_inbox$;
CREATE OR REPLACE VIEW diesel_inbox_refused AS SELECT diesel_inbox_refuse() AS refused;
GRANT SELECT ON diesel_inbox_refused TO PUBLIC;
