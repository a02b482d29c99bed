// Package pgrepl speaks the part of PostgreSQL's streaming replication
// protocol that the log-based relay needs: START_REPLICATION of a logical
// slot with the pgoutput plugin, the transactional messages written by
// pg_logical_emit_message (pgoutput's "messages" option), and the standby
// status updates that let the server recycle WAL. It sits on pgx's pgconn,
// which carries the CopyBoth stream; pglogrepl, the usual library for this,
// is not used (it is not reachable from the module proxy here).
package pgrepl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// LSN is a WAL position.
type LSN uint64

// String formats l as PostgreSQL does (e.g. 0/16B3748).
func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l)) }

// Conn is a replication connection.
type Conn struct {
	pc     *pgconn.PgConn
	sendMu sync.Mutex // Receive runs in one goroutine, status updates may come from another
}

// Connect opens a replication connection (replication=database) with the
// settings of cfg, which is copied, named applicationName in the server
// (pg_stat_activity, pg_stat_replication): PostgreSQL keeps its first 63
// bytes, and shows a byte outside printable ASCII as '?'.
func Connect(ctx context.Context, cfg *pgconn.Config, applicationName string) (*Conn, error) {
	c := cfg.Copy()
	if c.RuntimeParams == nil {
		c.RuntimeParams = map[string]string{}
	}
	c.RuntimeParams["replication"] = "database"
	c.RuntimeParams["application_name"] = applicationName
	pc, err := pgconn.ConnectConfig(ctx, c)
	if err != nil {
		return nil, err
	}
	return &Conn{pc: pc}, nil
}

// Close closes the connection.
func (c *Conn) Close(ctx context.Context) error { return c.pc.Close(ctx) }

// StartLogical starts streaming slot from start (the server begins at the
// slot's confirmed position when start is older) with pgoutput, protocol
// version 1, publication and messages on. It returns the server's error
// (e.g. SQLSTATE 55006 when another process streams the slot) as a
// *pgconn.PgError.
func (c *Conn) StartLogical(ctx context.Context, slot, publication string, start LSN) error {
	q := fmt.Sprintf(`START_REPLICATION SLOT %s LOGICAL %s (proto_version '1', publication_names '%s', messages 'true')`,
		quoteIdent(slot), start, strings.ReplaceAll(quoteIdent(publication), "'", "''"))
	c.sendMu.Lock()
	c.pc.Frontend().Send(&pgproto3.Query{String: q})
	err := c.pc.Frontend().Flush()
	c.sendMu.Unlock()
	if err != nil {
		return err
	}
	for {
		msg, err := c.pc.ReceiveMessage(ctx)
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.CopyBothResponse:
			return nil
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
		default:
			return fmt.Errorf("pgrepl: unexpected %T starting replication", msg)
		}
	}
}

// Event is one thing read from the stream. Exactly one of its pointers is
// set, or none (a message of pgoutput the relay does not use).
type Event struct {
	Begin     *Begin
	Message   *Message
	Commit    *Commit
	Keepalive *Keepalive
}

// Begin starts a transaction.
type Begin struct {
	FinalLSN   LSN // the commit record's LSN
	CommitTime time.Time
	XID        uint32
}

// Message is a logical decoding message (pg_logical_emit_message).
type Message struct {
	Transactional bool
	LSN           LSN
	Prefix        string
	Content       []byte // a copy, the caller's to keep
}

// Commit ends a transaction.
type Commit struct {
	CommitLSN  LSN
	EndLSN     LSN // confirm this one: everything before it is done
	CommitTime time.Time
}

// Keepalive is the server's heartbeat. WALEnd is how far the server has
// decoded and sent: every transaction committed before it has been sent.
type Keepalive struct {
	WALEnd         LSN
	ReplyRequested bool
}

// ErrStreamEnded reports that the server ended the stream (CopyDone).
var ErrStreamEnded = errors.New("pgrepl: the server ended the replication stream")

// Receive reads the next event. It blocks until one arrives or ctx ends.
func (c *Conn) Receive(ctx context.Context) (Event, error) {
	for {
		msg, err := c.pc.ReceiveMessage(ctx)
		if err != nil {
			return Event{}, err
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			return decodeCopyData(m.Data)
		case *pgproto3.ErrorResponse:
			return Event{}, pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyDone:
			return Event{}, ErrStreamEnded
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
		default:
			return Event{}, fmt.Errorf("pgrepl: unexpected %T in the replication stream", msg)
		}
	}
}

// SendStatus tells the server that everything before flushed is durably
// processed (it may recycle that WAL and will restart the slot there).
func (c *Conn) SendStatus(flushed LSN, replyRequested bool) error {
	buf := make([]byte, 0, 34)
	buf = append(buf, 'r')
	buf = binary.BigEndian.AppendUint64(buf, uint64(flushed)) // written
	buf = binary.BigEndian.AppendUint64(buf, uint64(flushed)) // flushed
	buf = binary.BigEndian.AppendUint64(buf, uint64(flushed)) // applied
	buf = binary.BigEndian.AppendUint64(buf, uint64(toPGTime(time.Now())))
	reply := byte(0)
	if replyRequested {
		reply = 1
	}
	buf = append(buf, reply)
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.pc.Frontend().Send(&pgproto3.CopyData{Data: buf})
	return c.pc.Frontend().Flush()
}

// pgEpoch is PostgreSQL's time zero.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func toPGTime(t time.Time) int64    { return t.Sub(pgEpoch).Microseconds() }
func fromPGTime(us int64) time.Time { return pgEpoch.Add(time.Duration(us) * time.Microsecond) }

// errShort reports a message shorter than its layout.
func errShort(what string) error { return fmt.Errorf("pgrepl: %s message too short", what) }

func decodeCopyData(d []byte) (Event, error) {
	if len(d) == 0 {
		return Event{}, errShort("CopyData")
	}
	switch d[0] {
	case 'k': // Primary keepalive: walEnd, serverTime, replyRequested
		if len(d) < 18 {
			return Event{}, errShort("keepalive")
		}
		return Event{Keepalive: &Keepalive{WALEnd: LSN(binary.BigEndian.Uint64(d[1:])), ReplyRequested: d[17] == 1}}, nil
	case 'w': // XLogData: walStart, walEnd, serverTime, then the plugin's message
		if len(d) < 25 {
			return Event{}, errShort("XLogData")
		}
		return decodePgoutput(d[25:])
	}
	return Event{}, nil
}

// decodePgoutput reads the pgoutput (protocol 1) messages the relay uses:
// Begin, Message and Commit. Others (relations, origins, row changes of
// tables in the publication) are returned as an empty Event.
func decodePgoutput(d []byte) (Event, error) {
	if len(d) == 0 {
		return Event{}, errShort("pgoutput")
	}
	switch d[0] {
	case 'B': // final LSN, commit time, xid
		if len(d) < 21 {
			return Event{}, errShort("Begin")
		}
		return Event{Begin: &Begin{
			FinalLSN:   LSN(binary.BigEndian.Uint64(d[1:])),
			CommitTime: fromPGTime(int64(binary.BigEndian.Uint64(d[9:]))),
			XID:        binary.BigEndian.Uint32(d[17:]),
		}}, nil
	case 'C': // flags, commit LSN, end LSN, commit time
		if len(d) < 26 {
			return Event{}, errShort("Commit")
		}
		return Event{Commit: &Commit{
			CommitLSN:  LSN(binary.BigEndian.Uint64(d[2:])),
			EndLSN:     LSN(binary.BigEndian.Uint64(d[10:])),
			CommitTime: fromPGTime(int64(binary.BigEndian.Uint64(d[18:]))),
		}}, nil
	case 'M': // flags, LSN, prefix (NUL-terminated), length, content
		if len(d) < 10 {
			return Event{}, errShort("Message")
		}
		m := &Message{Transactional: d[1]&1 == 1, LSN: LSN(binary.BigEndian.Uint64(d[2:]))}
		rest := d[10:]
		end := indexByte(rest, 0)
		if end < 0 || len(rest) < end+5 {
			return Event{}, errShort("Message")
		}
		m.Prefix = string(rest[:end])
		rest = rest[end+1:]
		n := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(n) > uint64(len(rest)) {
			return Event{}, errShort("Message")
		}
		m.Content = append([]byte(nil), rest[:n]...)
		return Event{Message: m}, nil
	}
	return Event{}, nil
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// quoteIdent quotes an identifier for the replication command.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
