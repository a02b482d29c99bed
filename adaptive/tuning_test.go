package adaptive_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func TestProfilesAreValid(t *testing.T) {
	for _, name := range adaptive.ProfileNames() {
		t.Run(name, func(t *testing.T) {
			tuning, err := adaptive.Profile(name)
			if err != nil {
				t.Fatalf("Profile(%q): %v", name, err)
			}
			if err := tuning.Validate(); err != nil {
				t.Fatalf("profile %q is invalid: %v", name, err)
			}
			if tuning.ProfileName() != name {
				t.Fatalf("Profile(%q).ProfileName() = %q", name, tuning.ProfileName())
			}
			if tuning.WithDefaults() != tuning {
				t.Fatalf("profile %q has a zero field: %+v", name, tuning)
			}
		})
	}
}

func TestProfileByName(t *testing.T) {
	tests := []struct {
		name string
		want adaptive.Tuning
	}{
		{"default", adaptive.Default()},
		{"low-latency", adaptive.LowLatency()},
		{"high-throughput", adaptive.HighThroughput()},
		{"background", adaptive.Background()},
		{"  Low-Latency ", adaptive.LowLatency()},
		{"HIGH-THROUGHPUT", adaptive.HighThroughput()},
	}
	// The profile for background work was called "relaxed", a word the
	// outbox uses for commits that do not wait for their WAL flush.
	if _, err := adaptive.Profile("relaxed"); !errors.Is(err, adaptive.ErrUnknownProfile) || !strings.Contains(err.Error(), "background") {
		t.Fatalf(`Profile("relaxed") = %v, want ErrUnknownProfile naming "background"`, err)
	}
	for _, tt := range tests {
		got, err := adaptive.Profile(tt.name)
		if err != nil {
			t.Fatalf("Profile(%q): %v", tt.name, err)
		}
		if got != tt.want {
			t.Fatalf("Profile(%q) = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestProfileUnknownName(t *testing.T) {
	for _, name := range []string{"", "  ", "fast", "low_latency", "defaults"} {
		_, err := adaptive.Profile(name)
		if !errors.Is(err, adaptive.ErrUnknownProfile) {
			t.Fatalf("Profile(%q) error %v does not match ErrUnknownProfile", name, err)
		}
		for _, allowed := range adaptive.ProfileNames() {
			if !strings.Contains(err.Error(), allowed) {
				t.Fatalf("error %q does not list allowed name %q", err, allowed)
			}
		}
	}
}

func TestProfilesDiffer(t *testing.T) {
	def, ll, ht, rx := adaptive.Default(), adaptive.LowLatency(), adaptive.HighThroughput(), adaptive.Background()
	if !(ll.BatchSize < def.BatchSize && ll.BackoffBase < def.BackoffBase) {
		t.Error("low-latency must use smaller batches and retry sooner than default")
	}
	if !(ht.BatchSize > def.BatchSize && ht.LeaseTTL > def.LeaseTTL) {
		t.Error("high-throughput must use bigger batches and longer leases than default")
	}
	if !(rx.BackoffBase > def.BackoffBase && rx.BackoffMax > def.BackoffMax) {
		t.Error("relaxed must back off longer")
	}
}

// A Tuning made by hand is Default() where it is zero: setting one field
// leaves the others at the profile's values (it used to take a complete
// set, and Tuning{BatchSize: 200} failed validation).
func TestZeroFieldsTakeTheirProfilesValues(t *testing.T) {
	def := adaptive.Default()
	if got := (adaptive.Tuning{}).WithDefaults(); got != def {
		t.Fatalf("Tuning{}.WithDefaults() = %+v, want Default() %+v", got, def)
	}
	got := adaptive.Tuning{BatchSize: 200}.WithDefaults()
	want := def
	want.BatchSize = 200
	if got != want {
		t.Fatalf("Tuning{BatchSize: 200}.WithDefaults() = %+v, want %+v", got, want)
	}
	// A profile's zero field takes that profile's value, not Default's.
	ll := adaptive.LowLatency()
	ll.BackoffMax = 0
	if got := ll.WithDefaults(); got != adaptive.LowLatency() {
		t.Fatalf("LowLatency() with BackoffMax zeroed: %+v, want LowLatency() %+v", got, adaptive.LowLatency())
	}
	if ll.ProfileName() != "low-latency" || (adaptive.Tuning{}).ProfileName() != "default" {
		t.Fatalf("ProfileName: %q, %q", ll.ProfileName(), (adaptive.Tuning{}).ProfileName())
	}
}

// Setting any one field, to any value valid on its own, never fails
// validation: the defaults of the others make room for it.
func TestSettingOneFieldNeverFailsValidation(t *testing.T) {
	for name, tu := range map[string]adaptive.Tuning{
		"BatchSize":             {BatchSize: 1},
		"big BatchSize":         {BatchSize: 100_000},
		"BackoffBase":           {BackoffBase: time.Millisecond},
		"BackoffBase above max": {BackoffBase: time.Hour},
		"BackoffMax":            {BackoffMax: time.Hour},
		"BackoffMax below base": {BackoffMax: time.Millisecond},
		"LeaseTTL short":        {LeaseTTL: 100 * time.Millisecond},
		"LeaseTTL long":         {LeaseTTL: time.Hour},
		"a profile, BackoffBase": func() adaptive.Tuning {
			t := adaptive.Background()
			t.BackoffMax = 0
			t.BackoffBase = time.Hour
			return t
		}(),
	} {
		if err := tu.Validate(); err != nil {
			t.Errorf("%s: %+v: %v", name, tu, err)
		}
		if d := tu.WithDefaults(); d.BackoffMax < d.BackoffBase {
			t.Errorf("%s: BackoffMax %v below BackoffBase %v", name, d.BackoffMax, d.BackoffBase)
		}
	}
}

func TestTuningValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*adaptive.Tuning)
		field  string
	}{
		{"negative batch", func(t *adaptive.Tuning) { t.BatchSize = -10 }, "BatchSize"},
		{"negative backoff base", func(t *adaptive.Tuning) { t.BackoffBase = -1 }, "BackoffBase"},
		{"max below base", func(t *adaptive.Tuning) { t.BackoffMax = t.BackoffBase - 1 }, "BackoffMax"},
		{"negative max", func(t *adaptive.Tuning) { t.BackoffMax = -1 }, "BackoffMax"},
		{"negative lease", func(t *adaptive.Tuning) { t.LeaseTTL = -1 }, "LeaseTTL"},
		{"lease below 100ms", func(t *adaptive.Tuning) { t.LeaseTTL = 99 * time.Millisecond }, "LeaseTTL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tuning := adaptive.Default()
			tt.mutate(&tuning)
			requireConfigError(t, tuning.Validate(), tt.field)
		})
	}
}

func TestConfigErrorMessage(t *testing.T) {
	tuning := adaptive.Default()
	tuning.LeaseTTL = time.Millisecond
	err := tuning.Validate()
	const want = "outbox: invalid configuration: LeaseTTL: must be >= 100ms (0 for the profile's), got 1ms" // one ConfigError, one format, module-wide
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v, want %q", err, want)
	}
}

func requireConfigError(t *testing.T, err error, field string) {
	t.Helper()
	if !errors.Is(err, sentinel.ErrInvalidConfig) {
		t.Fatalf("error %v does not match ErrInvalidConfig", err)
	}
	var ce *outboxtype.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v is not a *ConfigError", err)
	}
	if ce.Field != field {
		t.Fatalf("ConfigError.Field = %q, want %q (error: %v)", ce.Field, field, err)
	}
	if ce.Reason == "" {
		t.Fatal("ConfigError.Reason is empty")
	}
}
