// Package dbsql holds every SQL statement of the outbox: one .sql file per
// table (topics.sql, partitions.sql, pending.sql, log.sql, cursors.sql,
// members.sql, dead_letters.sql, dedup_keys.sql, plus catalog.sql for the
// schema's own bookkeeping) and the migrations that create those tables.
// No other package writes SQL; they run the statements of [For] with bind
// parameters.
//
// A statement lives in the file of the table it writes, or, for a read, of
// the table it reads first; a reader finds every statement that moves a
// cursor in cursors.sql. Each statement starts with a line
//
//	-- name: CursorsAdvance
//
// followed by comment lines that document its parameters, then the SQL up to
// the next name line. The name is the field of [Queries] that holds it. The
// only template variable is {{schema}}, the outbox schema, validated by the
// caller (internal/names) and quoted here; every value is a bind parameter.
// LISTEN and UNLISTEN, which take a channel name and no parameter, are
// built by [Listen] and [Unlisten] (notify.go).
package dbsql

import (
	"embed"
	"fmt"
	"io/fs"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

//go:embed *.sql migrations/*.sql
var files embed.FS

// Queries holds every statement of the outbox for one schema. Get it with
// [For]; the fields are filled from the .sql files, by name.
type Queries struct {
	// topics.sql
	TopicsRegister         string
	TopicsPartitions       string
	TopicsForwardOnly      string
	TopicsForwardOnlyNames string
	TopicsStatus           string
	TopicsIncarnation      string

	// partitions.sql
	PartitionsLockPending string

	// pending.sql
	PendingInsert          string
	PendingInsertNotify    string
	PendingInsertOne       string
	PendingInsertOneNotify string
	PendingInsertRelayed   string
	PendingHeldKeys        string
	PendingSequence        string
	PendingForwardRead     string
	PendingForwarded       string
	PendingMetrics         string
	PendingAny             string
	PendingCanVacuum       string
	PendingVacuum          string

	// log.sql
	LogRead             string
	LogReadCounting     string
	LogReadCountingMany string
	LogReadSeqs         string
	LogTrim             string
	LogOldestKept       string

	// held.sql
	HeldLoad              string
	HeldAdopt             string
	HeldInsert            string
	HeldCount             string
	HeldUndoCount         string
	HeldRetry             string
	HeldRelease           string
	HeldShowFull          string
	HeldStatus            string
	HeldHeads             string
	HeldRetryNow          string
	HeldRequestDeadLetter string
	HeldClear             string

	// cursors.sql
	CursorsCreate             string
	CursorsBalance            string
	CursorsAcquire            string
	CursorsRenew              string
	CursorsRelease            string
	CursorsStillHeld          string
	CursorsWriter             string
	CursorsSetWriter          string
	CursorsAdvance            string
	CursorsAdvanceRelaxed     string
	CursorsAdvanceRelaxedMany string
	CursorsRetry              string
	CursorsUndoDelivery       string
	CursorsMarkInFlight       string
	CursorsInspect            string
	CursorsSaveAdaptive       string
	CursorsHorizon            string
	CursorsRetentionHolders   string
	CursorsPause              string
	CursorsLockForResetToSeq  string
	CursorsLockForResetToTime string
	CursorsReset              string
	CursorsLockGroup          string
	CursorsGroupInUse         string
	CursorsDeleteGroup        string
	CursorsStatus             string
	CursorsStatusHolders      string
	CursorsMetrics            string
	CursorsTickState          string

	// members.sql
	MembersExpire      string
	MembersLeave       string
	MembersChanged     string
	MembersLockGroup   string
	MembersDeleteGroup string
	MembersStatus      string

	// dead_letters.sql
	DeadLettersInsert         string
	DeadLettersListAscending  string
	DeadLettersListDescending string
	DeadLettersCount          string
	DeadLettersGet            string
	DeadLettersGetForUpdate   string
	DeadLettersMarkReplayed   string
	DeadLettersDiscard        string
	DeadLettersPurge          string
	DeadLettersPurgeResolved  string
	DeadLettersDeleteGroup    string
	DeadLettersMetrics        string

	// transaction.sql
	TxSavepointDelivery string
	TxNextDelivery      string
	TxReleaseDelivery   string
	TxRollbackDelivery  string
	TxSavepointBatch    string
	TxReleaseBatch      string
	TxRollbackBatch     string
	TxRelaxedCommit     string

	// inbox_marks.sql
	InboxCreateTable string
	InboxHasSource   string
	InboxAddSource   string
	InboxEnsure      string
	InboxLock        string
	InboxAdvance     string

	// published.sql
	PublishedOfTopic string

	// dedup_keys.sql
	DedupKeysInsertPending string
	DedupKeysEmit          string
	DedupKeysPurgeExpired  string
	DedupKeysStatus        string

	// wal.sql
	WALEmit              string
	WALEmitOne           string
	WALPrerequisites     string
	WALPublicationExists string
	WALPublicationCreate string
	WALPublicationDrop   string
	WALSlotExists        string
	WALSlotCreate        string
	WALSlotDrop          string
	WALSlotState         string
	WALDropLock          string
	WALDropUnlock        string
	WALFlush             string
	WALPublishers        string
	WALUnrelayed         string
	WALSlotHolder        string
	WALRelayInit         string
	WALRelayDelete       string
	WALRelayPosition     string
	WALSlotStatus        string
	WALEndStaleAppenders string
	WALAdvance           string
	WALAppendSmall       string
	WALAppendPending     string
	PendingNotify        string
	BodiesNextIDs        string

	// catalog.sql
	CatalogLock          string
	CatalogCreateSchema  string
	CatalogDropSchema    string
	CatalogVersionTable  string
	CatalogVersion       string
	CatalogRecordVersion string
	CatalogCheckVersion  string
	CatalogNow           string
	CatalogNowMinus      string
}

var (
	parsed = mustParse()
	cache  sync.Map // schema -> *Queries
)

// For returns the statements for schema, a name already validated by
// internal/names. The result is shared: do not modify it.
func For(schema string) *Queries {
	if q, ok := cache.Load(schema); ok {
		return q.(*Queries)
	}
	q := &Queries{}
	v := reflect.ValueOf(q).Elem()
	for name, text := range parsed {
		v.FieldByName(name).SetString(Render(text, schema))
	}
	actual, _ := cache.LoadOrStore(schema, q)
	return actual.(*Queries)
}

// Render fills the template variables of text, quoted as identifiers:
// {{schema}} with schema and {{wal}} with WALName(schema). It is the only
// way a name gets into the outbox's SQL.
func Render(text, schema string) string {
	text = strings.ReplaceAll(text, "{{wal}}", pgx.Identifier{WALName(schema)}.Sanitize())
	return strings.ReplaceAll(text, "{{schema}}", pgx.Identifier{schema}.Sanitize())
}

// LargePayload is the size from which a payload is stored in bodies, not
// inline (0007_bodies.sql): the publish statements in pending.sql write the
// same number, and the log-based relay uses this constant.
const LargePayload = 1024

// WALName is the name of the replication slot and of the publication of
// schema's log-based mode (wal.sql): the schema name followed by "_wal",
// within PostgreSQL's 63 bytes for the longest valid schema name.
func WALName(schema string) string { return schema + "_wal" }

// mustParse reads the .sql files into name -> statement and checks that the
// names and the fields of Queries match one to one. The files are part of
// the binary, so a mismatch is a programming error, caught by any test.
func mustParse() map[string]string {
	out := map[string]string{}
	entries, err := fs.Glob(files, "*.sql")
	if err != nil {
		panic(err)
	}
	for _, file := range entries {
		body, err := files.ReadFile(file)
		if err != nil {
			panic(err)
		}
		if err := parseFile(file, string(body), out); err != nil {
			panic(err)
		}
	}
	t := reflect.TypeFor[Queries]()
	for i := range t.NumField() {
		if _, ok := out[t.Field(i).Name]; !ok {
			panic("dbsql: no statement named " + t.Field(i).Name + " in the .sql files")
		}
	}
	for name := range out {
		if _, ok := t.FieldByName(name); !ok {
			panic("dbsql: statement " + name + " has no field in Queries")
		}
	}
	return out
}

// parseFile splits one file into its named statements.
func parseFile(file, body string, out map[string]string) error {
	name := ""
	var cur strings.Builder
	flush := func() error {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if name == "" {
			if text != "" && !onlyComments(text) {
				return fmt.Errorf("dbsql: %s: SQL before the first -- name: line", file)
			}
			return nil
		}
		if _, dup := out[name]; dup {
			return fmt.Errorf("dbsql: %s: statement %s defined twice", file, name)
		}
		if text == "" || onlyComments(text) {
			return fmt.Errorf("dbsql: %s: statement %s is empty", file, name)
		}
		out[name] = strings.TrimSuffix(stripLeadingComments(text), ";")
		return nil
	}
	for line := range strings.Lines(body) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "-- name:"); ok {
			if err := flush(); err != nil {
				return err
			}
			name = strings.TrimSpace(rest)
			continue
		}
		cur.WriteString(line)
	}
	return flush()
}

// stripLeadingComments drops the comment lines that document a statement,
// so that they do not travel to the server with it.
func stripLeadingComments(text string) string {
	for strings.HasPrefix(text, "--") {
		_, rest, _ := strings.Cut(text, "\n")
		text = strings.TrimSpace(rest)
	}
	return text
}

func onlyComments(text string) bool {
	for line := range strings.Lines(text) {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "--") {
			return false
		}
	}
	return true
}

// Migration is one schema version: the DDL that creates or changes tables,
// with {{schema}} to be filled by [Render].
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations are the schema versions 1..n, in order.
var Migrations = mustLoadMigrations()

func mustLoadMigrations() []Migration {
	entries, err := fs.ReadDir(files, "migrations")
	if err != nil {
		panic(err)
	}
	var out []Migration
	for _, e := range entries {
		prefix, rest, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(prefix)
		if !ok || err != nil {
			panic("dbsql: bad migration file name " + e.Name())
		}
		body, err := files.ReadFile("migrations/" + e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(rest, ".sql"), SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			panic(fmt.Sprintf("dbsql: migration versions must be 1..n, found %d at position %d", m.Version, i+1))
		}
	}
	return out
}
