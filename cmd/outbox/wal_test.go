package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/termsafe"
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

// wal drop-slot takes --force (with no slot, there is nothing to refuse),
// and a non-WAL relay refuses --instance.
func TestWALDropSlotForceAndRelayInstanceFlags(t *testing.T) {
	b := outboxtest.Setup(t)
	c := newCLI(t, b.Schema)
	for _, args := range [][]string{{"wal", "drop-slot", "--yes"}, {"wal", "drop-slot", "--yes", "--force"}} {
		if out := c.ok(args...); !strings.Contains(out, "slot "+b.Schema+"_wal dropped") {
			t.Fatalf("outbox %s: %q", strings.Join(args, " "), out)
		}
	}
	if code, _, stderr := c.run("", "pipeline", "--instance", "a"); code != exitUsage || !strings.Contains(stderr, "--instance applies to --wal only") {
		t.Fatalf("relay --instance without --wal: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := c.run("", "pipeline", "--wal", "--instance", strings.Repeat("x", 41)); code != exitUsage || !strings.Contains(stderr, "--instance") {
		t.Fatalf("relay --wal --instance of 41 bytes: exit %d, stderr %q", code, stderr)
	}
}

// outbox status names the relay streaming the slot (the slot itself is
// tested against a real relay in package relay: admin.Report.WALSlot).
func TestStatusNamesTheRelayStreamingTheSlot(t *testing.T) {
	var out bytes.Buffer
	statusTable(termsafe.NewWriter(&out), admin.Report{WALSlot: &admin.WALSlot{Slot: "s_wal", Active: true, ActiveInstance: "relay-a", ActivePID: 4242}})
	if !strings.Contains(out.String(), "wal slot s_wal: a relay streams it: relay-a (server pid 4242)") {
		t.Fatalf("status of a slot streamed by relay-a:\n%s", out.String())
	}
}
