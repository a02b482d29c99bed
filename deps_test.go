package outbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	"./forwarder/kafka", "./inbox", "./metrics", "./outboxtype", "./partitioning", "./pipeline", "./relay", "./retention", "./schema",
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

// schemaLibraries are what package schema needs (the registry client and
// wire format, Avro, .proto parsing, JSON Schema validation): only schema
// may link them, so that an application that does not validate events
// links none of them.
var schemaLibraries = []string{
	"github.com/twmb/franz-go/pkg/sr", "github.com/hamba/avro", "github.com/bufbuild/protocompile",
	"github.com/santhosh-tekuri/jsonschema", "github.com/json-iterator/go", "github.com/modern-go/",
}

// isSchemaLibrary reports a package of schemaLibraries.
func isSchemaLibrary(dep string) bool {
	for _, l := range schemaLibraries {
		if dep == l || strings.HasPrefix(dep, l) && (strings.HasSuffix(l, "/") || strings.HasPrefix(dep, l+"/")) {
			return true
		}
	}
	return false
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
			if isSchemaLibrary(dep) {
				if pkg != "./schema" {
					t.Errorf("%s links %s; only schema may (an application that does not import schema links none of its libraries)", pkg, dep)
				}
				continue
			}
			for client, allowed := range brokerClients {
				if (dep == client || strings.HasPrefix(dep, client+"/")) && pkg != allowed {
					t.Errorf("%s links the broker client %s; only %q may", pkg, dep, allowed)
				}
			}
		}
	}
}

// The console renders a payload in the wire format through its
// PayloadDecoder interface: it links neither package schema nor the
// formats' libraries, so that an application mounting the console links
// Avro, Protobuf and JSON Schema only when it uses them.
func TestTheConsoleLinksNoSchemaFormat(t *testing.T) {
	t.Parallel()
	for dep := range strings.Lines(goList(t, ".", "list", "-deps", "./console")) {
		dep = strings.TrimSpace(dep)
		for _, f := range []string{"github.com/millrace/watermill-outbox/schema", "github.com/hamba/avro", "github.com/bufbuild/protocompile",
			"github.com/santhosh-tekuri/jsonschema", "github.com/twmb/franz-go/pkg/sr", "google.golang.org/protobuf"} {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("./console links %s", dep)
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
			pkg == module+"/bench" || pkg == module+"/outboxtest" || pkg == module+"/schema/schematest" {
			continue // not imported by applications' production code (outboxtest, schema/schematest: by their tests)
		}
		rel := "." + strings.TrimPrefix(pkg, module)
		if !slices.Contains(libraryPackages, rel) {
			t.Errorf("package %s is not in libraryPackages: add it so its dependencies are checked", rel)
		}
	}
}

// application makes an application module in a temporary directory: Go
// version goVersion, requiring the library (replaced by this checkout) and
// requires ("path version"). It returns the directory and a function that
// writes a file into it.
func application(t *testing.T, goVersion string, requires ...string) (string, func(name, content string)) {
	t.Helper()
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
	mod := "module example.com/app\n\ngo " + goVersion + "\n\nrequire (\n\tgithub.com/millrace/watermill-outbox v0.0.0-00010101000000-000000000000\n"
	for _, r := range requires {
		mod += "\t" + r + "\n"
	}
	write("go.mod", mod+")\n\nreplace github.com/millrace/watermill-outbox => "+root+"\n")
	return app, write
}

// A program that imports the root package and forwarder/kafka inherits,
// through the library's go.mod, none of the tools' dependencies: the
// benchmark's River and gonum, the console test's chromedp, the test
// brokers kfake and nats-server, the CLI's cobra, the tests' embedded-postgres.
// They live in modules of their own (cmd, _examples, integration, pgtemp), so
// they are not in the program's module graph at all. And it links none of
// the schema package's libraries (Avro, .proto parsing, JSON Schema).
func TestAnApplicationsModuleGraphHoldsNoToolDependencies(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("resolves a module graph: not in -short")
	}
	app, write := application(t, "1.25.0")
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
	// The schema package's libraries are in the graph (the library's go.mod
	// requires them) but the program links none of them; one that imports
	// schema does.
	for dep := range strings.Lines(goList(t, app, "list", "-deps", ".")) {
		if isSchemaLibrary(strings.TrimSpace(dep)) {
			t.Errorf("a program that does not import schema links %s", strings.TrimSpace(dep))
		}
	}
	write("schema.go", "package main\n\nimport _ \"github.com/millrace/watermill-outbox/schema\"\n")
	goList(t, app, "mod", "tidy")
	if deps := goList(t, app, "list", "-deps", "."); !strings.Contains(deps, "github.com/hamba/avro/v2\n") {
		t.Errorf("a program that imports schema does not link hamba/avro: the check above proves nothing:\n%s", deps)
	}
}

// An application that tests its Kafka forwarding with kfake builds with the
// franz-go and kfake pair docs/testing.md names, after `go mod tidy`,
// outside the workspace: the pair the library's own franz-go (v1.21.7, for
// Go 1.25) does not give (today's kfake needs a newer franz-go). The pair
// named there is the one _examples and integration build with.
func TestAnApplicationTestingWithKfakeBuildsWithThePairTheDocsName(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("resolves a module graph and compiles kfake: not in -short")
	}
	doc, err := os.ReadFile("docs/testing.md")
	if err != nil {
		t.Fatal(err)
	}
	pair := regexp.MustCompile(`go get github.com/twmb/franz-go@(v\S+) github.com/twmb/franz-go/pkg/kfake@(v\S+)`).FindStringSubmatch(string(doc))
	if pair == nil {
		t.Fatal("docs/testing.md names no franz-go and kfake pair (`go get github.com/twmb/franz-go@… github.com/twmb/franz-go/pkg/kfake@…`)")
	}
	franz, kfake := pair[1], pair[2]
	for _, mod := range []string{"_examples/go.mod", "integration/go.mod"} {
		data, err := os.ReadFile(mod)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), "github.com/twmb/franz-go "+franz+"\n") || !strings.Contains(string(data), "github.com/twmb/franz-go/pkg/kfake "+kfake+"\n") {
			t.Errorf("%s does not build with the pair docs/testing.md names (franz-go %s, kfake %s)", mod, franz, kfake)
		}
	}
	app, write := application(t, "1.26.0", "github.com/twmb/franz-go "+franz, "github.com/twmb/franz-go/pkg/kfake "+kfake)
	write("app.go", `package app

import "github.com/millrace/watermill-outbox/forwarder/kafka"

// Target is what the application forwards with.
func Target(brokers []string) (*kafka.Target, error) {
	return kafka.NewTarget(kafka.Config{Brokers: brokers}, nil)
}
`)
	write("app_test.go", `package app

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

func TestForwardsToKfake(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	target, err := Target(c.ListenAddrs())
	if err != nil {
		t.Fatal(err)
	}
	_ = target.Close()
}
`)
	goList(t, app, "mod", "tidy")
	goList(t, app, "vet", "./...") // compiles the test, kfake included, against what tidy kept
	if graph := goList(t, app, "list", "-m", "github.com/twmb/franz-go"); !strings.Contains(graph, franz) {
		t.Errorf("after go mod tidy the application builds with %s, not the franz-go %s docs/testing.md names", strings.TrimSpace(graph), franz)
	}
}
