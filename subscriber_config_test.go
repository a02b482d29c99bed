package outbox

import (
	"bufio"
	"context"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// maxKnobs is issue 26's bound on the settable fields reachable from
// SubscriberConfig: a configuration a newcomer can hold.
const maxKnobs = 20

// knob is one settable leaf field reachable from SubscriberConfig.
type knob struct {
	path  string // "Tuning.BatchSize"
	index []int  // for reflect.Value.FieldByIndex
	typ   reflect.Type
}

// knobs walks SubscriberConfig's exported fields, into the structs it
// holds by value (Tuning, KeyIsolation, Advanced), and returns the leaves:
// every field a program can set.
func knobs() []knob {
	var out []knob
	var walk func(t reflect.Type, prefix string, index []int)
	walk = func(t reflect.Type, prefix string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			idx := append(append([]int(nil), index...), i)
			if f.Type.Kind() == reflect.Struct {
				walk(f.Type, prefix+f.Name+".", idx)
				continue
			}
			out = append(out, knob{path: prefix + f.Name, index: idx, typ: f.Type})
		}
	}
	walk(reflect.TypeFor[SubscriberConfig](), "", nil)
	return out
}

// docDefaults reads the table of docs/configuration.md's SubscriberConfig
// section: the first column names a knob (`Tuning.BatchSize`), the second
// its default, as the first `code` span or a leading "required" or
// "none" (the zero value).
func docDefaults(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open("docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	in, table := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			if table {
				return out
			}
			in = line == "## `outbox.SubscriberConfig`"
		case in && strings.HasPrefix(line, "|"):
			table = true
			cells := strings.Split(strings.Trim(line, "|"), "|")
			if len(cells) < 2 {
				t.Fatalf("table row with one cell: %q", line)
			}
			name, def := strings.TrimSpace(cells[0]), strings.TrimSpace(cells[1])
			if name == "knob" || strings.HasPrefix(name, "---") {
				continue
			}
			name = strings.Trim(name, "`")
			if _, dup := out[name]; dup {
				t.Errorf("docs/configuration.md lists %s twice", name)
			}
			switch {
			case strings.HasPrefix(def, "required"), strings.HasPrefix(def, "none"):
				out[name] = ""
			case strings.HasPrefix(def, "`"):
				out[name] = strings.SplitN(def[1:], "`", 2)[0]
			default:
				t.Errorf("docs/configuration.md: the default of %s, %q, starts with neither a `value` nor required/none", name, def)
			}
		case table && !strings.HasPrefix(line, "|"):
			return out
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !table {
		t.Fatal("docs/configuration.md has no table in its ## `outbox.SubscriberConfig` section")
	}
	return out
}

// matches reports whether v, a field's value after defaults, is what the
// docs write as doc ("" for the zero value).
func matches(v reflect.Value, doc string) bool {
	if doc == "" {
		return v.IsZero()
	}
	switch x := v.Interface().(type) {
	case schemaDeadLetters:
		return doc == "dead_letters" // the schema's own table
	case time.Duration:
		d, err := time.ParseDuration(doc)
		return err == nil && d == x
	case Strategy:
		return strings.EqualFold(x.String(), doc)
	}
	switch v.Kind() {
	case reflect.String:
		return v.String() == doc
	case reflect.Bool:
		b, err := strconv.ParseBool(doc)
		return err == nil && b == v.Bool()
	case reflect.Int, reflect.Int64, reflect.Int32:
		n, err := strconv.ParseInt(strings.ReplaceAll(doc, ",", ""), 10, 64)
		return err == nil && n == v.Int()
	}
	return false
}

// The one table of docs/configuration.md names every knob of
// SubscriberConfig, no other, with the default the code gives a zero
// field, through the path NewSubscriber takes; and there are at most 20.
func TestConfigurationTableMatchesTheCode(t *testing.T) {
	t.Parallel()
	ks := knobs()
	if len(ks) > maxKnobs {
		var names []string
		for _, k := range ks {
			names = append(names, k.path)
		}
		t.Errorf("%d knobs reachable from SubscriberConfig, more than %d: %s", len(ks), maxKnobs, strings.Join(names, ", "))
	}
	docs := docDefaults(t)
	cfg := SubscriberConfig{}
	cfg.setDefaults() // what NewSubscriber does after Validate
	v := reflect.ValueOf(cfg)
	seen := map[string]bool{}
	for _, k := range ks {
		seen[k.path] = true
		doc, ok := docs[k.path]
		if !ok {
			t.Errorf("docs/configuration.md does not list %s", k.path)
			continue
		}
		if got := v.FieldByIndex(k.index); !matches(got, doc) {
			t.Errorf("docs/configuration.md: %s defaults to %q; the code gives %v", k.path, doc, got.Interface())
		}
	}
	for name := range docs {
		if !seen[name] {
			t.Errorf("docs/configuration.md lists %s, which SubscriberConfig does not have", name)
		}
	}
}

// Setting any one knob, to a value valid on its own, never fails
// validation: each default that depends on another field follows it (a
// Tuning with only BatchSize set used to fail, and so did a HandlerTimeout
// above the default lease TTL; MaxAttempts needed a RejectHandler, which
// now defaults to the schema's dead-letter table).
func TestSettingOneKnobNeverFailsValidation(t *testing.T) {
	t.Parallel()
	base := SubscriberConfig{Pool: &pgxpool.Pool{}, ConsumerGroup: "g"}
	if err := base.Validate(); err != nil {
		t.Fatalf("Pool and ConsumerGroup alone: %v", err)
	}
	defaults := base
	defaults.setDefaults()
	dv := reflect.ValueOf(defaults)
	reject := outboxtype.RejectHandlerFunc(func(context.Context, pgx.Tx, outboxtype.RejectedMessage) error { return nil })
	tried := 0
	for _, k := range knobs() {
		var values []any
		def := dv.FieldByIndex(k.index)
		switch x := def.Interface().(type) {
		case time.Duration:
			values = []any{x / 100, x * 3, x * 100}
		case Strategy:
			values = []any{Transactional}
		case string:
			values = []any{"other_schema"}
		case bool:
			values = []any{!x}
		case int:
			values = []any{1, max(x, 1) * 3, max(x, 1) * 100}
		case outboxtype.RejectHandler, nil:
			if k.path == "RejectHandler" {
				values = []any{outboxtype.RejectHandler(reject)}
			}
		}
		if k.path == "Pool" || k.path == "ConsumerGroup" {
			continue // required: set in base
		}
		if len(values) == 0 {
			t.Errorf("no value to try for %s (%v)", k.path, k.typ)
		}
		for _, val := range values {
			c := base
			reflect.ValueOf(&c).Elem().FieldByIndex(k.index).Set(reflect.ValueOf(val).Convert(k.typ))
			if err := c.Validate(); err != nil {
				t.Errorf("%s = %v alone: %v", k.path, val, err)
			}
			tried++
		}
	}
	if tried < 20 {
		t.Fatalf("tried only %d settings", tried)
	}
}

// A PublisherConfig with one limit set never fails for another's default:
// MaxPublishBytes below the default MaxPayloadBytes lowers that default.
func TestPublisherLimitsFollowEachOther(t *testing.T) {
	t.Parallel()
	for _, c := range []PublisherConfig{
		{MaxPublishBytes: 512 << 10},
		{MaxPayloadBytes: 128 << 20},
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
		c.setDefaults()
		if c.MaxPayloadBytes > c.MaxPublishBytes {
			t.Errorf("MaxPayloadBytes %d above MaxPublishBytes %d", c.MaxPayloadBytes, c.MaxPublishBytes)
		}
	}
}

// The profile table of docs/operations.md shows every profile's values as
// internal/tune holds them.
func TestProfileTableMatchesTheProfiles(t *testing.T) {
	t.Parallel()
	rows := map[string]func(tune.Profile) any{
		"`Tuning.BatchSize`":                               func(p tune.Profile) any { return p.BatchSize },
		"`Tuning.BackoffBase`":                             func(p tune.Profile) any { return p.BackoffBase },
		"`Tuning.BackoffMax`":                              func(p tune.Profile) any { return p.BackoffMax },
		"`Tuning.LeaseTTL`":                                func(p tune.Profile) any { return p.LeaseTTL },
		"`Advanced.PollInterval`":                          func(p tune.Profile) any { return p.PollInterval },
		"`Advanced.MaxConcurrentPartitions`":               func(p tune.Profile) any { return p.MaxConcurrentPartitions },
		"failed batches in a row before the batch shrinks": func(p tune.Profile) any { return p.DegradeAfter },
		"busy pace: shortest wait between full batches":    func(p tune.Profile) any { return p.MinInterval },
		"busy pace: wait after the first full batch":       func(p tune.Profile) any { return p.ActiveInterval },
		"busy pace: ramp step per further full batch":      func(p tune.Profile) any { return p.RampStep },
		"pace of the subscriber's own sequencer (`MinPassInterval`), and the one to give a log-based relay (`Tuning.AppendInterval()`)":      func(p tune.Profile) any { return p.SequencerInterval },
		"sequencer's (relay's) wait after a pass of one message, growing with each further message up to the pace above (`tune.FollowLoad`)": func(p tune.Profile) any { return tune.FollowLoad(p.SequencerInterval, 1) },
	}
	b, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Choosing a tuning profile")
	if !ok {
		t.Fatal("docs/operations.md has no section ## Choosing a tuning profile")
	}
	profiles := tune.Profiles()
	seen := map[string]bool{}
	for line := range strings.Lines(section) {
		if strings.HasPrefix(line, "## ") {
			break
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) != 1+len(profiles) {
			continue
		}
		name := strings.TrimSpace(cells[0])
		get, known := rows[name]
		switch {
		case name == "value" || strings.HasPrefix(name, "---") || strings.HasPrefix(name, "*derived:*"):
			continue
		case !known:
			t.Errorf("docs/operations.md's profile table has a row %q this test does not know", name)
			continue
		}
		seen[name] = true
		for i, p := range profiles {
			cell := strings.TrimSpace(cells[1+i])
			switch want := get(p).(type) {
			case int:
				if n, err := strconv.Atoi(strings.ReplaceAll(cell, ",", "")); err != nil || n != want {
					t.Errorf("docs/operations.md: %s of %s is %q; the profile has %d", name, p.Name, cell, want)
				}
			case time.Duration:
				if d, err := time.ParseDuration(cell); err != nil || d != want {
					t.Errorf("docs/operations.md: %s of %s is %q; the profile has %v", name, p.Name, cell, want)
				}
			}
		}
	}
	for name := range rows {
		if !seen[name] {
			t.Errorf("docs/operations.md's profile table has no row %s", name)
		}
	}
}
