-- The log-based mode's publish (wal.sql WALEmit, WALEmitOne): a message is
-- written into the WAL only if a relay can read it once its transaction
-- commits, checked in the same statement as the write. Before, a
-- Publisher in ModeWAL on a server without the schema's slot (not created
-- yet, or dropped) or with wal_level below logical wrote messages that no
-- slot would ever decode, and the caller's transaction committed without
-- them. Now such a publish fails inside the caller's transaction, which
-- aborts it, so its other writes cannot commit without their messages.
--
-- wal_emit(slot, prefix, records) writes each record with
-- pg_logical_emit_message(true, prefix, record) after checking, in order
-- (once per transaction: its later calls skip the checks):
--
-- 1. A shared advisory lock of the slot, held until the transaction ends.
--    relay.DropSlot takes it exclusively (try, never waiting): it refuses
--    to drop the slot while a transaction that published into it is open,
--    and a publish waits for a drop in progress, then finds no slot.
-- 2. wal_level = logical; else SQLSTATE WO001.
-- 3. The slot: a logical slot of pgoutput named slot in this database;
--    else WO002. Its confirmed_flush_lsn must be set; else WO003. While
--    PostgreSQL creates a logical slot (pg_create_logical_replication_slot)
--    the slot is listed already, with confirmed_flush_lsn NULL, and it waits
--    for the transactions running when it started, this one possibly among
--    them, to end; a transaction that commits before the slot's consistent
--    point is never decoded by it (snapbuild.c: only transactions that
--    commit after the consistent point are replayed). confirmed_flush_lsn
--    is set once that point is reached, and this transaction's commit
--    record comes after this check, so after that point: it is decoded.
--    Waiting instead of failing would deadlock with the creation, which
--    waits for this transaction. A slot whose wal_status is lost
--    (max_slot_wal_keep_size exceeded) can no longer be streamed: WO004.
--
-- The Publisher maps WO001 to outbox.ErrWALLevel and WO002..WO004 to
-- outbox.ErrNoSlot. The lock's key is hashtextextended('watermill-outbox
-- wal ' || slot, 0), as in wal.sql (WALDropLock, WALPublishers).
CREATE FUNCTION {{schema}}.wal_emit(slot text, prefix text, records bytea[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
	v_confirmed pg_catalog.pg_lsn;
	v_status    text;
	v_n         bigint;
BEGIN
	-- Once per transaction (or savepoint level): the lock is held to its
	-- end, so its later publishes need not look again. Reading
	-- pg_replication_slots is most of the check's cost (about 75 µs).
	IF pg_catalog.current_setting('watermill_outbox.wal_checked', true) IS DISTINCT FROM slot THEN
		PERFORM pg_catalog.pg_advisory_xact_lock_shared(pg_catalog.hashtextextended('watermill-outbox wal ' || slot, 0));
		IF pg_catalog.current_setting('wal_level') <> 'logical' THEN
			RAISE EXCEPTION 'watermill-outbox: wal_level is %, not logical: no slot can decode messages written now', pg_catalog.current_setting('wal_level')
				USING ERRCODE = 'WO001', HINT = 'Set wal_level = logical and restart PostgreSQL.';
		END IF;
		SELECT s.confirmed_flush_lsn, s.wal_status INTO v_confirmed, v_status
		FROM pg_catalog.pg_replication_slots s
		WHERE s.slot_name = slot AND s.database = pg_catalog.current_database() AND s.slot_type = 'logical' AND s.plugin = 'pgoutput';
		IF NOT FOUND THEN
			RAISE EXCEPTION 'watermill-outbox: replication slot % does not exist in this database', slot
				USING ERRCODE = 'WO002', HINT = 'Create it with outbox wal create-slot (relay.CreateSlot).';
		END IF;
		IF v_confirmed IS NULL THEN
			RAISE EXCEPTION 'watermill-outbox: replication slot % is being created and would not decode this transaction', slot
				USING ERRCODE = 'WO003', HINT = 'Roll back, and retry once the slot is created.';
		END IF;
		IF v_status = 'lost' THEN
			RAISE EXCEPTION 'watermill-outbox: replication slot % was invalidated (wal_status lost)', slot
				USING ERRCODE = 'WO004', HINT = 'Drop it and create it again (outbox wal drop-slot --force; outbox wal create-slot).';
		END IF;
		PERFORM pg_catalog.set_config('watermill_outbox.wal_checked', slot, true);
	END IF;
	SELECT pg_catalog.count(pg_catalog.pg_logical_emit_message(true, prefix, x.r)) INTO v_n
	FROM (SELECT u.r FROM pg_catalog.unnest(records) WITH ORDINALITY AS u(r, ord) ORDER BY u.ord) x;
	RETURN v_n;
END
$fn$;
