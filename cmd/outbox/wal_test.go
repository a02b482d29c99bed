package main

import (
	"strings"
	"testing"

	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// On a server without wal_level = logical (the CLI tests' cluster), wal
// create-slot fails saying what to change, and status says there is no
// slot. (The slot's life on a logical server is tested in package relay.)
func TestWALCommandsSayWhatTheServerLacks(t *testing.T) {
	b := outboxtest.Setup(t)
	c := newCLI(t, b.Schema)
	code, _, stderr := c.run("", "wal", "create-slot")
	if code == 0 || !strings.Contains(stderr, "wal_level = logical") {
		t.Fatalf("wal create-slot on wal_level = replica: exit %d, stderr %q", code, stderr)
	}
	if out := c.ok("wal", "status"); !strings.Contains(out, "does not exist") || !strings.Contains(out, b.Schema+"_wal") {
		t.Fatalf("wal status without a slot: %q", out)
	}
	var st struct {
		Slot   string
		Exists bool
	}
	c.json(&st, "wal", "status")
	if st.Exists || st.Slot != b.Schema+"_wal" {
		t.Fatalf("wal status --output json: %+v", st)
	}
}
