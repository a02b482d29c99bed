package consumer

import (
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// The ledger numbers the head's deliveries as the read counted them, and a
// later message of the batch from 1.
func TestLedgerNumbersDeliveries(t *testing.T) {
	l := newLedger(5, 0, "", 3)
	l.counted(5, 2)
	if got := l.attemptOf(5); got != 2 {
		t.Fatalf("attempt of the head: %d, want 2 (the read's count)", got)
	}
	if got := l.attemptOf(4); got != 1 {
		t.Fatalf("attempt of an earlier message: %d, want 1", got)
	}
	if got := l.attemptOf(7); got != 1 || l.seq != 7 || l.charged != 0 {
		t.Fatalf("attempt of a later message: %d (following %d, charged %d), want 1, following it afresh", got, l.seq, l.charged)
	}
}

// MaxAttempts counts recorded failures: a message is exhausted when a
// failure now would be its MaxAttempts-th, used up once it has that many.
func TestLedgerExhaustedAtMaxAttempts(t *testing.T) {
	l := newLedger(1, 1, "", 3)
	if l.exhausted() || l.used() {
		t.Fatal("exhausted after one failure of three")
	}
	l.recorded()
	if !l.exhausted() || l.used() {
		t.Fatal("after two failures of three: a third is the last, not yet used up")
	}
	l.recorded()
	if !l.used() {
		t.Fatal("three failures of three: used up")
	}
	if none := newLedger(1, 50, "", 0); none.exhausted() || none.used() {
		t.Fatal("MaxAttempts 0 never exhausts")
	}
}

// The reason of a rejection after MaxAttempts is told apart from a
// handler's own outbox.Reject (both match ErrPoison).
func TestLedgerPoisonIsToldFromAHandlersReject(t *testing.T) {
	l := newLedger(1, 2, "", 3)
	reason := l.poison(errors.New("boom"))
	if !errors.Is(reason, sentinel.ErrPoison) || !isExhausted(reason) || !strings.Contains(reason.Error(), "failed 3 times") {
		t.Fatalf("poison: %v", reason)
	}
	if handler := (&errs.PoisonError{Cause: errors.New("bad")}); isExhausted(handler) {
		t.Fatal("a handler's Reject counted as MaxAttempts")
	}
}

// The failure recorded says which message and attempt, is remembered for
// the dead letter and is bounded.
func TestLedgerFailureText(t *testing.T) {
	l := newLedger(9, 0, "", 3)
	l.counted(9, 2)
	err := l.failure(errors.New(strings.Repeat("x", 5000)))
	if !strings.HasPrefix(err.Error(), "seq 9, attempt 2: x") || len(err.Error()) > 2010 || l.lastError != err.Error() {
		t.Fatalf("failure text (%d bytes): %.60q", len(err.Error()), err.Error())
	}
	if l.failure(nil).Error() != "seq 9, attempt 2: nacked" {
		t.Fatalf("a plain nack: %q", l.lastError)
	}
}

// The ledger keeps the first and last failure times of the message.
func TestLedgerFailureTimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLedger(1, 0, "", 0)
		start := time.Now()
		l.failed(time.Now())
		time.Sleep(time.Minute)
		l.failed(time.Now())
		if !l.first.Equal(start) || l.last.Sub(l.first) != time.Minute {
			t.Fatalf("first %v, last %v", l.first, l.last)
		}
	})
}

// Careful mode lasts a minute after it is extended; a nil mode never is.
func TestCarefulModeLastsItsWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c Careful
		if c.On() {
			t.Fatal("careful before any crash")
		}
		c.Extend()
		time.Sleep(carefulWindow - time.Second)
		if !c.On() {
			t.Fatal("not careful within the window")
		}
		time.Sleep(2 * time.Second)
		if c.On() {
			t.Fatal("still careful after the window")
		}
		var none *Careful
		none.Extend()
		if none.On() {
			t.Fatal("a nil mode is careful")
		}
	})
}
