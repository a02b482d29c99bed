package retention_test

import (
	"context"
	"errors"
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/retention"
)

// deadLetter stores a dead letter in status, last changed age ago.
func (e env) deadLetter(t *testing.T, seq int64, status string, age time.Duration) {
	t.Helper()
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO `+e.Schema+`.dead_letters
		(group_name, topic, partition, seq, uuid, metadata, payload, reason, attempts, first_failure_at, last_failure_at, status, created_at, updated_at)
		VALUES ('g', 'orders', 0, $1, gen_random_uuid()::text, '{}', 'p', 'poison', 3, now(), now(), $2,
			now() - $3::int8 * interval '1 microsecond', now() - $3::int8 * interval '1 microsecond')`,
		seq, status, age.Microseconds()); err != nil {
		t.Fatal(err)
	}
}

func (e env) deadLetterSeqs(t *testing.T) []int64 {
	t.Helper()
	rows, err := e.Pool.Query(context.Background(), `SELECT seq FROM `+e.Schema+`.dead_letters ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// Each pass deletes the dead letters dealt with (replayed, discarded) longer
// ago than DeadLettersKeepFor, at most ChunkSize at a time; pending ones
// stay however old, recent ones stay, and Forever keeps everything.
func TestDeadLettersDealtWithAreDeletedAfterDeadLettersKeepFor(t *testing.T) {
	e := newEnv(t)
	const day = 24 * time.Hour
	e.deadLetter(t, 1, "pending", 30*day)
	e.deadLetter(t, 2, "replayed", 30*day)
	e.deadLetter(t, 3, "discarded", 30*day)
	e.deadLetter(t, 4, "discarded", 8*day)
	e.deadLetter(t, 5, "replayed", time.Hour)
	e.deadLetter(t, 6, "discarded", time.Hour)

	if _, err := e.vacuum(t, retention.Config{DeadLettersKeepFor: retention.Forever}).VacuumOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := e.deadLetterSeqs(t); len(got) != 6 {
		t.Fatalf("Forever: %v left, want all 6", got)
	}

	v := e.vacuum(t, retention.Config{ChunkSize: 2}) // the default, a week
	stats, err := v.VacuumOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if stats.DeadLetters != 2 || !stats.More {
		t.Fatalf("first pass: %d deleted, more %v; want 2 (ChunkSize) and more", stats.DeadLetters, stats.More)
	}
	if stats, err = v.VacuumOnce(context.Background()); err != nil || stats.DeadLetters != 1 {
		t.Fatalf("second pass: %d deleted, %v; want the third old one", stats.DeadLetters, err)
	}
	if got := e.deadLetterSeqs(t); len(got) != 3 || got[0] != 1 || got[1] != 5 || got[2] != 6 {
		t.Fatalf("after a week's retention: %v left, want [1 5 6] (pending, and the recent ones)", got)
	}
	if v.Stats().DeadLetters != 3 {
		t.Fatalf("Stats().DeadLetters = %d, want 3", v.Stats().DeadLetters)
	}

	if _, err := e.vacuum(t, retention.Config{DeadLettersKeepFor: time.Minute}).VacuumOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := e.deadLetterSeqs(t); len(got) != 1 || got[0] != 1 {
		t.Fatalf("after a minute's retention: %v left, want [1]: pending entries are never deleted", got)
	}
}

func TestDeadLettersKeepForMustBePositiveOrForever(t *testing.T) {
	pool := pgtest.Pool(t)
	for _, d := range []time.Duration{-2, -time.Hour} {
		if err := (retention.Config{Pool: pool, DeadLettersKeepFor: d}).Validate(); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("DeadLettersKeepFor %v: %v, want ErrInvalidConfig", d, err)
		}
	}
	for _, d := range []time.Duration{retention.Forever, 0, time.Hour} {
		if err := (retention.Config{Pool: pool, DeadLettersKeepFor: d}).Validate(); err != nil {
			t.Errorf("DeadLettersKeepFor %v: %v", d, err)
		}
	}
}
