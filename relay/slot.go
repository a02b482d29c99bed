package relay

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
)

// Errors the log-based mode returns; each says what to change.
var (
	// ErrWALLevel: the server does not run with wal_level = logical.
	ErrWALLevel = errors.New("relay: logical decoding needs wal_level = logical; set it in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL")
	// ErrReplicationPrivilege: the role may not use replication slots.
	ErrReplicationPrivilege = errors.New("relay: the role may not use replication slots; grant it with ALTER ROLE <role> REPLICATION, or connect as a role that has it")
	// ErrNoSlot: the schema's slot does not exist.
	ErrNoSlot = errors.New("relay: the schema's replication slot does not exist; create it with relay.CreateSlot (or: outbox wal create-slot)")
	// ErrSlotActive: DropSlot found a relay streaming the slot.
	ErrSlotActive = errors.New("relay: a relay is streaming the slot; stop every relay of the schema, then drop it")
	// ErrRecordVersion: a record in the WAL was written by a newer release.
	ErrRecordVersion = errors.New("relay: a message in the WAL was written by a newer release of watermill-outbox; upgrade the relay")
)

// Prerequisites checks that the server and the role can run the log-based
// mode: wal_level = logical (ErrWALLevel) and the replication privilege
// (ErrReplicationPrivilege).
func Prerequisites(ctx context.Context, pool *pgxpool.Pool) error {
	var level string
	var canReplicate bool
	var maxSlots int32
	if err := pool.QueryRow(ctx, dbsql.For(names.DefaultSchema).WALPrerequisites).Scan(&level, &canReplicate, &maxSlots); err != nil {
		return err
	}
	if level != "logical" {
		return fmt.Errorf("%w (wal_level is %q)", ErrWALLevel, level)
	}
	if !canReplicate {
		return fmt.Errorf("%w (role %q)", ErrReplicationPrivilege, pool.Config().ConnConfig.User)
	}
	if maxSlots < 1 {
		return fmt.Errorf("%w (max_replication_slots is 0; raise it and restart PostgreSQL)", ErrWALLevel)
	}
	return nil
}

// CreateSlot prepares schema (migrated with outbox.Migrate) for the
// log-based mode: its publication (of no tables) and its logical
// replication slot (pgoutput), both named Slot(schema). It checks
// Prerequisites first, and does nothing that already exists, so it can run
// at every start, like Migrate.
//
// From the moment the slot exists PostgreSQL keeps the WAL a relay has not
// read: run a Relay, or DropSlot when the mode is no longer used.
func CreateSlot(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if schema == "" {
		schema = names.DefaultSchema
	}
	if err := names.Schema(schema); err != nil {
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
// Messages published in ModeWAL and not yet relayed are lost with the slot.
// It refuses while a relay streams the slot (ErrSlotActive).
func DropSlot(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if schema == "" {
		schema = names.DefaultSchema
	}
	if err := names.Schema(schema); err != nil {
		return err
	}
	q := dbsql.For(schema)
	slot := Slot(schema)
	var exists bool
	if err := pool.QueryRow(ctx, q.WALSlotExists, slot).Scan(&exists); err != nil {
		return err
	}
	if exists {
		if _, err := pool.Exec(ctx, q.WALSlotDrop, slot); err != nil {
			if isSlotBusy(err) {
				return fmt.Errorf("%w: %v", ErrSlotActive, err)
			}
			return fmt.Errorf("relay: drop replication slot %s: %w", slot, classify(err))
		}
	}
	if _, err := pool.Exec(ctx, q.WALPublicationDrop); err != nil {
		return fmt.Errorf("relay: drop publication %s: %w", slot, err)
	}
	if _, err := pool.Exec(ctx, q.WALRelayDelete, slot); err != nil {
		return schemacheck.Wrap(err, schema)
	}
	return nil
}

// SlotStatus is what an operator needs to know about a schema's slot.
type SlotStatus struct {
	Slot   string
	Exists bool
	// Active: a relay streams the slot now.
	Active bool
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
	if schema == "" {
		schema = names.DefaultSchema
	}
	if err := names.Schema(schema); err != nil {
		return SlotStatus{}, err
	}
	st := SlotStatus{Slot: Slot(schema)}
	var confirmed, appended int64
	err := pool.QueryRow(ctx, dbsql.For(schema).WALSlotStatus, st.Slot).Scan(&st.Active, &st.RetainedWALBytes, &confirmed, &st.WALStatus, &appended)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, schemacheck.Wrap(err, schema)
	}
	st.Exists, st.ConfirmedLSN, st.AppendedLSN = true, uint64(confirmed), uint64(appended)
	return st, nil
}

// Status reports the relay's slot.
func (r *Relay) Status(ctx context.Context) (SlotStatus, error) {
	return StatusOf(ctx, r.cfg.Pool, r.cfg.Schema)
}

func isDuplicate(err error) bool {
	var pgErr interface{ SQLState() string }
	return errors.As(err, &pgErr) && (pgErr.SQLState() == "42710" || pgErr.SQLState() == "42P07")
}
