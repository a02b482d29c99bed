package outbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// Typed handles: Migrate (and RegisterTopic, TopicPartitions,
// CurrentSchemaVersion) take an outbox.DB, so a wrong handle is refused by
// the compiler, not at run time. The program in testdata/wronghandle passes
// a string; building it must fail, naming the constraint.
func TestAWrongHandleIsACompileError(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "build", "-o", t.TempDir()+"/wronghandle", "./testdata/wronghandle").CombinedOutput()
	if err == nil {
		t.Fatal("a string passed to outbox.Migrate compiled")
	}
	if !strings.Contains(string(out), "does not satisfy outbox.DB") {
		t.Fatalf("the build failed, but not on the handle's type:\n%s", out)
	}
}
