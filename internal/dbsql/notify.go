package dbsql

import "github.com/jackc/pgx/v5"

// Listen is the statement that subscribes a connection to channel, a name
// made by internal/names (PendingChannel, SequencedChannel), quoted here.
// LISTEN takes no bind parameter, so the channel is an identifier.
func Listen(channel string) string { return "LISTEN " + pgx.Identifier{channel}.Sanitize() }

// Unlisten is the statement that ends a connection's subscription to
// channel.
func Unlisten(channel string) string { return "UNLISTEN " + pgx.Identifier{channel}.Sanitize() }
