-- Wakes the outbox relays when rows are written: every statement that inserts
-- into the outbox sends one notification on the channel `outbox` (delivered at
-- commit, and only if the transaction commits; several in one transaction are
-- folded into one). The relays LISTEN on it instead of polling the table, and
-- poll only slowly as a fallback (a lost listening connection).
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
