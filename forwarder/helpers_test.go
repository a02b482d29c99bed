package forwarder_test

import (
	"testing"

	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// The forwarder's tests that need no broker; the outbox side of them is
// internal/fwdtest, shared with the broker tests of the integration module.
func TestMain(m *testing.M) { pgtest.Main(m) }
