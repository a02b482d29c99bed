package errs

import "errors"

// The log-based mode's errors: returned by a Publisher in ModeWAL (package
// outbox) and by the relay package, which re-export them under the same
// identity.
var (
	ErrWALLevel = errors.New("outbox: the log-based mode (ModeWAL) needs wal_level = logical; set it in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL")
	ErrNoSlot   = errors.New("outbox: the schema's replication slot does not exist; create it with relay.CreateSlot (or: outbox wal create-slot)")
)
