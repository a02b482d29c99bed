package main

import (
	"bytes"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// lockedBuffer is a bytes.Buffer safe for the demo's concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The demo, a smaller run of it, ends with OK and logs not one warning or
// error: in particular none about its own configuration, such as a
// forwarder without a RejectHandler.
func TestDemoRunsCleanly(t *testing.T) {
	var out, log lockedBuffer
	code := run([]string{"-messages", "1500", "-publishers", "2", "-partitions", "4", "-keys", "30"}, &out, &log)
	if code != exitOK || !strings.Contains(out.String(), "\nOK (") {
		t.Fatalf("the demo exited %d\n%s\nlog:\n%s", code, out.String(), log.String())
	}
	if bad := regexp.MustCompile(`(?m)^.*level=(WARN|ERROR).*$`).FindAllString(log.String(), -1); len(bad) > 0 {
		t.Fatalf("the demo logged %d warning(s) or error(s):\n%s", len(bad), strings.Join(bad, "\n"))
	}
}
