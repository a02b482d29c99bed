package outbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// Library packages never import the demo, the benchmarks, a command or a
// test-only dependency (the OpenTelemetry SDK included: the core uses the
// API only), only the forwarder links a broker client and only metrics
// links Prometheus (as the README's dependency table says).
func TestLibraryPackagesKeepTheirDependenciesLean(t *testing.T) {
	forbidden := []string{
		"github.com/twmb/franz-go/pkg/kfake", "github.com/nats-io/nats-server", "go.uber.org/goleak", "gonum.org/",
		"github.com/millrace/watermill-outbox/cmd/", "github.com/millrace/watermill-outbox/bench",
		"github.com/millrace/watermill-outbox/internal/pgtest", "github.com/millrace/watermill-outbox/internal/pgcluster",
		"github.com/millrace/watermill-outbox/internal/ceiling",
		"github.com/millrace/watermill-outbox/internal/outboxtest",
		"testing", "go.opentelemetry.io/otel/sdk", "github.com/spf13/cobra", "github.com/chromedp/",
	}
	brokers := []string{"github.com/IBM/sarama", "github.com/nats-io/nats.go", "github.com/twmb/franz-go"}
	for _, pkg := range []string{".", "./adaptive", "./admin", "./console", "./deadletter", "./forwarder", "./inbox", "./metrics", "./partitioning", "./retention"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for dep := range strings.Lines(string(out)) {
			dep = strings.TrimSpace(dep)
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f) && (strings.HasSuffix(f, "/") || strings.HasPrefix(dep, f+"/")) {
					t.Errorf("%s imports %s", pkg, dep)
				}
			}
			if strings.HasPrefix(dep, "github.com/prometheus/") && pkg != "./metrics" {
				t.Errorf("%s links Prometheus; only metrics may", pkg)
			}
			if pkg == "./forwarder" {
				continue
			}
			for _, b := range brokers {
				if strings.HasPrefix(dep, b) {
					t.Errorf("%s links the broker client %s; only forwarder may", pkg, dep)
				}
			}
		}
	}
}
