package schematest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: a
// stand-in's server and connections, or a client's.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
