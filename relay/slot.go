package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// Errors the log-based mode returns; each says what to change. A server
// without wal_level = logical, and a schema without its slot, are
// outbox.ErrWALLevel and outbox.ErrNoSlot, as a Publisher in ModeWAL
// returns them.
var (
	// ErrReplicationPrivilege: the role may not use replication slots.
	ErrReplicationPrivilege = errors.New("relay: the role may not use replication slots; grant it with ALTER ROLE <role> REPLICATION, or connect as a role that has it")
	// ErrSlotActive: DropSlot found a relay streaming the slot.
	ErrSlotActive = errors.New("relay: a relay is streaming the slot; stop every relay of the schema, then drop it")
	// ErrSlotInUse: DropSlot found messages in the slot that no relay has
	// appended to the log yet, or open transactions that published into
	// it (*SlotInUseError); dropping the slot would lose them.
	ErrSlotInUse = errors.New("relay: the slot is in use: it holds messages not yet appended to the log, or transactions that published into it are open")
	// ErrRecordVersion: a record in the WAL was written by a newer release.
	ErrRecordVersion = errors.New("relay: a message in the WAL was written by a newer release of watermill-outbox; upgrade the relay")
)

// SlotInUseError is DropSlot's refusal to drop a slot that publishers use:
// what dropping it would lose. It matches ErrSlotInUse.
type SlotInUseError struct {
	Slot string
	// Unrelayed counts the messages committed into the slot and not yet
	// appended to the log; Bytes is the size of their records.
	Unrelayed, Bytes int64
	// Truncated: DropSlot stopped decoding after UnrelayedScanLimit
	// changes, so there may be more than Unrelayed (or some, when
	// Unrelayed is 0).
	Truncated bool
	// OpenTransactions are the server process ids (pg_stat_activity.pid)
	// of transactions that published into the slot (or tried to: a
	// refused publish holds the slot's lock until its transaction ends)
	// and have not ended: a message they commit after the drop would be
	// lost.
	OpenTransactions []int32
}

// Error says what dropping the slot would lose, and what to do.
func (e *SlotInUseError) Error() string {
	var what []string
	switch {
	case e.Unrelayed > 0 && e.Truncated:
		what = append(what, fmt.Sprintf("at least %s (%d bytes) that no relay has appended to the log yet (DropSlot stopped counting after %d changes)", plural(e.Unrelayed, "committed message"), e.Bytes, UnrelayedScanLimit))
	case e.Unrelayed > 0:
		what = append(what, fmt.Sprintf("%s (%d bytes) that no relay has appended to the log yet", plural(e.Unrelayed, "committed message"), e.Bytes))
	case e.Truncated:
		what = append(what, fmt.Sprintf("more than %d changes not yet streamed, which may include messages not appended to the log (DropSlot stopped counting there)", UnrelayedScanLimit))
	}
	if n := len(e.OpenTransactions); n > 0 {
		pids := make([]string, n)
		for i, pid := range e.OpenTransactions {
			pids[i] = fmt.Sprint(pid)
		}
		what = append(what, fmt.Sprintf("%s that published into it, or tried to (server pids %s), whose messages would be lost if they commit after the drop", plural(int64(n), "open transaction"), strings.Join(pids, ", ")))
	}
	if len(what) == 0 {
		what = append(what, "publishers use it")
	}
	return fmt.Sprintf("relay: slot %q is in use: it holds %s; dropping it would lose them: run a relay until the log has them (outbox pipeline --wal) and stop the schema's publishers in ModeWAL, or drop it anyway with force (outbox wal drop-slot --force)", e.Slot, strings.Join(what, ", and "))
}

func plural(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// Is makes errors.Is(err, ErrSlotInUse) true.
func (e *SlotInUseError) Is(target error) bool { return target == ErrSlotInUse }

// UnrelayedScanLimit bounds the changes (pgoutput rows: begin, message,
// commit) DropSlot decodes from the slot to count the messages it would
// lose; past it, DropSlot refuses unless forced.
const UnrelayedScanLimit = 100000

// args checks the pool and the schema name of a call, and returns the
// schema (DefaultSchema for "").
func args(pool *pgxpool.Pool, schema string) (string, error) {
	if pool == nil {
		return "", fmt.Errorf("%w: nil *pgxpool.Pool: pass the pool of the database that holds the schema", sentinel.ErrUnsupportedTx)
	}
	if schema == "" {
		schema = names.DefaultSchema
	}
	return schema, names.Schema(schema)
}

// Prerequisites checks that the server and the role can run the log-based
// mode: wal_level = logical (outbox.ErrWALLevel) and the replication privilege
// (ErrReplicationPrivilege).
func Prerequisites(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := args(pool, ""); err != nil {
		return err
	}
	var level string
	var canReplicate bool
	var maxSlots int32
	if err := pool.QueryRow(ctx, dbsql.For(names.DefaultSchema).WALPrerequisites).Scan(&level, &canReplicate, &maxSlots); err != nil {
		return err
	}
	if level != "logical" {
		return fmt.Errorf("%w (wal_level is %q)", sentinel.ErrWALLevel, level)
	}
	if !canReplicate {
		return fmt.Errorf("%w (role %q)", ErrReplicationPrivilege, pool.Config().ConnConfig.User)
	}
	if maxSlots < 1 {
		return fmt.Errorf("%w (max_replication_slots is 0; raise it and restart PostgreSQL)", sentinel.ErrWALLevel)
	}
	return nil
}

// CreateSlot prepares schema (migrated with outbox.Migrate) for the
// log-based mode: its publication (of no tables) and its logical
// replication slot (pgoutput), both named Slot(schema). It checks
// Prerequisites first, and does nothing that already exists, so it can run
// at every start, like Migrate.
//
// Publishers in ModeWAL fail with outbox.ErrNoSlot until it has returned: while
// PostgreSQL creates a slot it waits for the transactions open at that
// moment to end, and the slot would not decode them.
//
// From the moment the slot exists PostgreSQL keeps the WAL a relay has not
// read: run a Relay, or DropSlot when the mode is no longer used.
func CreateSlot(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	schema, err := args(pool, schema)
	if err != nil {
		return err
	}
	if err := Prerequisites(ctx, pool); err != nil {
		return err
	}
	db, _ := pgexec.FromDB(pool)
	if err := schemacheck.Check(ctx, pool, db, schema); err != nil {
		return err
	}
	q := dbsql.For(schema)
	slot := Slot(schema)
	var exists bool
	if err := pool.QueryRow(ctx, q.WALPublicationExists, slot).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if _, err := pool.Exec(ctx, q.WALPublicationCreate); err != nil && !isDuplicate(err) {
			return fmt.Errorf("relay: create publication %s: %w", slot, classify(err))
		}
	}
	if err := pool.QueryRow(ctx, q.WALSlotExists, slot).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if _, err := pool.Exec(ctx, q.WALSlotCreate, slot); err != nil && !isDuplicate(err) {
			return fmt.Errorf("relay: create replication slot %s: %w", slot, classify(err))
		}
	}
	if _, err := pool.Exec(ctx, q.WALRelayInit, slot); err != nil {
		return err
	}
	return nil
}

// DropSlot removes what CreateSlot created: the slot (PostgreSQL then
// frees the WAL it kept), the publication and the relay's position.
// Publishers in ModeWAL of the schema fail with outbox.ErrNoSlot from then on.
//
// It refuses while a relay streams the slot (ErrSlotActive). Unless force
// is set, it also refuses (*SlotInUseError, ErrSlotInUse) while the slot
// holds committed messages no relay has appended to the log yet (it
// decodes the WAL the slot keeps to count them, up to UnrelayedScanLimit
// changes), or while a transaction that published into it is open. It
// counts once, then again holding the lock every publish into the slot
// takes shared, so that nothing commits into the slot between the last
// count and the drop; publishes wait for that second count. With force it
// drops the slot regardless, and those messages are lost.
func DropSlot(ctx context.Context, pool *pgxpool.Pool, schema string, force bool) error {
	schema, err := args(pool, schema)
	if err != nil {
		return err
	}
	q := dbsql.For(schema)
	slot := Slot(schema)
	// Before taking the connection the rest runs on: a pool of one must do.
	db, _ := pgexec.FromDB(pool)
	version, err := schemacheck.Version(ctx, db, schema)
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var exists bool
	var walStatus string
	if err := conn.QueryRow(ctx, q.WALSlotState, slot).Scan(&exists, &walStatus); err != nil {
		return err
	}
	if !exists && version == 0 {
		// Neither the schema's tables nor its slot: most likely a
		// mistyped schema name, which a silent nil would hide.
		return fmt.Errorf("%w: relay.DropSlot: schema %q has no outbox tables and no slot %s: nothing to drop (check the schema name; `outbox status` lists what a database holds)", sentinel.ErrNoSlot, schema, slot)
	}
	if exists && !force {
		// The messages a relay could still append: none once the slot is
		// lost (it can no longer be streamed), or without the schema's
		// tables.
		countable := walStatus != "lost" && version > 0
		if countable {
			// First without the lock, so that publishes do not wait while
			// the WAL is decoded to refuse.
			if err := unrelayed(ctx, conn, schema); err != nil {
				return err
			}
		}
		var locked bool
		if err := conn.QueryRow(ctx, q.WALDropLock, slot).Scan(&locked); err != nil {
			return err
		}
		if !locked {
			e := &SlotInUseError{Slot: slot}
			if err := conn.QueryRow(ctx, q.WALPublishers, slot).Scan(&e.OpenTransactions); err != nil {
				return err
			}
			return e
		}
		defer func() {
			unlockCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := conn.Exec(unlockCtx, q.WALDropUnlock, slot); err != nil {
				// The session keeps the lock: close it rather than return it
				// to the pool, where it would hold every publish.
				_ = conn.Conn().Close(unlockCtx)
			}
		}()
		// Again under the lock: what committed since the first count.
		if countable {
			if err := unrelayed(ctx, conn, schema); err != nil {
				return err
			}
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit: a no-op
	if _, err := tx.Exec(ctx, q.WALPublicationDrop); err != nil {
		return fmt.Errorf("relay: drop publication %s: %w", slot, err)
	}
	if version > 0 {
		if _, err := tx.Exec(ctx, q.WALRelayDelete, slot); err != nil {
			return schemacheck.Wrap(err, schema)
		}
	}
	// Last: dropping the slot is not undone by a rollback.
	if exists {
		if _, err := tx.Exec(ctx, q.WALSlotDrop, slot); err != nil {
			if isSlotBusy(err) {
				return fmt.Errorf("%w: %v", ErrSlotActive, err)
			}
			return fmt.Errorf("relay: drop replication slot %s: %w", slot, classify(err))
		}
	}
	return tx.Commit(ctx)
}

// unrelayed returns a *SlotInUseError when the schema's slot holds
// committed messages not yet appended to the log, counted by decoding the
// WAL it keeps (without consuming it) on conn. It flushes the WAL first:
// logical decoding reads only flushed WAL, and a transaction committed
// with synchronous_commit = off may not be flushed yet.
func unrelayed(ctx context.Context, conn *pgxpool.Conn, schema string) error {
	q := dbsql.For(schema)
	slot := Slot(schema)
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, q.WALFlush)
		return err
	})
	if err != nil {
		return fmt.Errorf("relay: flush the WAL before counting the messages the slot %s holds: %w", slot, err)
	}
	e := &SlotInUseError{Slot: slot}
	var rows int64
	prefix := append([]byte(names.WALPrefix(schema)), 0)
	err = conn.QueryRow(ctx, q.WALUnrelayed, slot, pgx.Identifier{slot}.Sanitize(), prefix, UnrelayedScanLimit).Scan(&e.Unrelayed, &e.Bytes, &rows)
	switch {
	case isSlotBusy(err):
		return fmt.Errorf("%w: %v", ErrSlotActive, err)
	case err != nil:
		return fmt.Errorf("relay: count the messages the slot %s holds: %w", slot, schemacheck.Wrap(err, schema))
	}
	e.Truncated = rows >= UnrelayedScanLimit
	if e.Unrelayed > 0 || e.Truncated {
		return e
	}
	return nil
}

// SlotStatus is what an operator needs to know about a schema's slot.
type SlotStatus struct {
	Slot   string
	Exists bool
	// Active: a relay streams the slot now.
	Active bool
	// ActivePID is the server process that streams the slot (0 when
	// none), and ActiveInstance who it streams for: the Config.Instance
	// of the relay (host:pid by default), or, for a session that is not a
	// relay's (pg_recvlogical, the session creating the slot), its whole
	// application_name.
	ActivePID      int32
	ActiveInstance string
	// RetainedWALBytes is the WAL PostgreSQL keeps for the slot: from the
	// slot's restart position to the server's current WAL position. It
	// grows while no relay runs.
	RetainedWALBytes int64
	// ConfirmedLSN is the position the relay confirmed (everything before
	// it is in the log); AppendedLSN the commit position of the last
	// transaction appended (relays table).
	ConfirmedLSN, AppendedLSN uint64
	// WALStatus is PostgreSQL's wal_status of the slot: reserved,
	// extended, unreserved, or lost (max_slot_wal_keep_size was exceeded
	// and the slot can no longer be streamed).
	WALStatus string
}

// StatusOf reports schema's slot.
func StatusOf(ctx context.Context, pool *pgxpool.Pool, schema string) (SlotStatus, error) {
	schema, err := args(pool, schema)
	if err != nil {
		return SlotStatus{}, err
	}
	q := dbsql.For(schema)
	st := SlotStatus{Slot: Slot(schema)}
	var confirmed, appended int64
	err = pool.QueryRow(ctx, q.WALSlotStatus, st.Slot).Scan(&st.Active, &st.RetainedWALBytes, &confirmed, &st.WALStatus, &appended)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, schemacheck.Wrap(err, schema)
	}
	st.Exists, st.ConfirmedLSN, st.AppendedLSN = true, uint64(confirmed), uint64(appended)
	if st.Active {
		err := pool.QueryRow(ctx, q.WALSlotHolder, st.Slot).Scan(&st.ActivePID, &st.ActiveInstance)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) { // (dropped meanwhile)
			return st, err
		}
	}
	return st, nil
}

// Status reports the relay's slot.
func (r *Relay) Status(ctx context.Context) (SlotStatus, error) {
	if err := r.made(); err != nil {
		return SlotStatus{}, err
	}
	return StatusOf(ctx, r.cfg.Pool, r.cfg.Schema)
}

func isDuplicate(err error) bool {
	var pgErr interface{ SQLState() string }
	return errors.As(err, &pgErr) && (pgErr.SQLState() == "42710" || pgErr.SQLState() == "42P07")
}
