package outbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// libraryPackages are the packages an application imports. Each must keep
// its imports lean (TestLibraryPackagesKeepTheirDependenciesLean); the
// list must name every public package of the module
// (TestLibraryPackageListIsComplete).
var libraryPackages = []string{
	".", "./adaptive", "./admin", "./console", "./deadletter", "./forwarder", "./forwarder/jetstream",
	"./forwarder/kafka", "./inbox", "./metrics", "./outboxtype", "./partitioning", "./pipeline", "./relay", "./retention",
}

// brokerClients are the broker client libraries, each with the one package
// allowed to link it: an application forwarding to NATS links no Kafka
// client, and the reverse. sarama is allowed nowhere: the library speaks
// Kafka through franz-go only.
var brokerClients = map[string]string{
	"github.com/twmb/franz-go":   "./forwarder/kafka",
	"github.com/nats-io/nats.go": "./forwarder/jetstream",
	"github.com/IBM/sarama":      "",
}

// goList runs the go command in the library module alone (GOWORK=off), as
// an application that depends on it sees it.
func goList(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Library packages never import the demo, the benchmarks, a command or a
// test-only dependency (the OpenTelemetry SDK included: the core uses the
// API only), only forwarder/kafka and forwarder/jetstream link a broker
// client (each its own), and only metrics links Prometheus (as the
// README's dependency table says).
func TestLibraryPackagesKeepTheirDependenciesLean(t *testing.T) {
	t.Parallel()
	forbidden := []string{
		"github.com/twmb/franz-go/pkg/kfake", "github.com/nats-io/nats-server", "go.uber.org/goleak", "gonum.org/",
		"github.com/millrace/watermill-outbox/cmd/", "github.com/millrace/watermill-outbox/bench",
		"github.com/millrace/watermill-outbox/integration", "github.com/millrace/watermill-outbox/_examples",
		"github.com/millrace/watermill-outbox/internal/pgtest", "github.com/millrace/watermill-outbox/internal/pgcluster",
		"github.com/millrace/watermill-outbox/internal/ceiling", "github.com/millrace/watermill-outbox/internal/consumer/consumerfake",
		"github.com/millrace/watermill-outbox/internal/outboxtest", "github.com/millrace/watermill-outbox/internal/fwdtest", "github.com/millrace/watermill-outbox/internal/consoletest",
		"testing", "go.opentelemetry.io/otel/sdk", "github.com/spf13/cobra", "github.com/chromedp/",
		"github.com/riverqueue/", "github.com/millrace/watermill-outbox/pgtemp", "github.com/fergusstrange/",
		"github.com/cloudevents/", // the targets write the CloudEvents bindings themselves; the SDK reads them in tests only
	}
	for _, pkg := range libraryPackages {
		for dep := range strings.Lines(goList(t, ".", "list", "-deps", pkg)) {
			dep = strings.TrimSpace(dep)
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f) && (strings.HasSuffix(f, "/") || strings.HasPrefix(dep, f+"/")) {
					t.Errorf("%s imports %s", pkg, dep)
				}
			}
			if strings.HasPrefix(dep, "github.com/prometheus/") && pkg != "./metrics" {
				t.Errorf("%s links Prometheus; only metrics may", pkg)
			}
			for client, allowed := range brokerClients {
				if (dep == client || strings.HasPrefix(dep, client+"/")) && pkg != allowed {
					t.Errorf("%s links the broker client %s; only %q may", pkg, dep, allowed)
				}
			}
		}
	}
}

// TestLibraryPackageListIsComplete fails when a public package is added
// without a place in libraryPackages.
func TestLibraryPackageListIsComplete(t *testing.T) {
	t.Parallel()
	const module = "github.com/millrace/watermill-outbox"
	for pkg := range strings.Lines(goList(t, ".", "list", "-f", "{{if .GoFiles}}{{.ImportPath}}{{end}}", "./...")) {
		pkg = strings.TrimSpace(pkg)
		if pkg == "" || strings.Contains(pkg, "/internal/") || strings.HasSuffix(pkg, "/internal") ||
			pkg == module+"/bench" || pkg == module+"/outboxtest" {
			continue // not imported by applications' production code (outboxtest: by their tests)
		}
		rel := "." + strings.TrimPrefix(pkg, module)
		if !slices.Contains(libraryPackages, rel) {
			t.Errorf("package %s is not in libraryPackages: add it so its dependencies are checked", rel)
		}
	}
}

// A program that imports the root package and forwarder/kafka inherits,
// through the library's go.mod, none of the tools' dependencies: the
// benchmark's River and gonum, the console test's chromedp, the test
// brokers kfake and nats-server, the CLI's cobra, the tests' embedded-postgres.
// They live in modules of their own (cmd, _examples, integration, pgtemp), so
// they are not in the program's module graph at all.
func TestAnApplicationsModuleGraphHoldsNoToolDependencies(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("resolves a module graph: not in -short")
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	app := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(app, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/app\n\ngo 1.25.0\n\n"+
		"require github.com/millrace/watermill-outbox v0.0.0-00010101000000-000000000000\n\n"+
		"replace github.com/millrace/watermill-outbox => "+root+"\n")
	write("main.go", `package main

import (
	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
)

func main() {
	_ = outbox.PublisherConfig{}
	_ = kafka.Config{}
}
`)
	goList(t, app, "mod", "tidy")
	graph := goList(t, app, "mod", "graph")
	for _, f := range []string{
		"github.com/riverqueue/", "gonum.org/", "github.com/chromedp/", "github.com/twmb/franz-go/pkg/kfake",
		"github.com/nats-io/nats-server", "github.com/spf13/cobra", "github.com/fergusstrange/embedded-postgres",
		"github.com/millrace/watermill-outbox/pgtemp", "github.com/cloudevents/",
	} {
		for line := range strings.Lines(graph) {
			if strings.Contains(line, f) {
				t.Errorf("the module graph of an application using the library holds %s:\n%s", f, line)
				break
			}
		}
	}
	if !strings.Contains(graph, "github.com/twmb/franz-go@") {
		t.Errorf("the graph does not hold franz-go: the check did not see the library's requirements:\n%s", graph)
	}
}
