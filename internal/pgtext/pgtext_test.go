package pgtext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestStorable(t *testing.T) {
	for s, want := range map[string]bool{"": true, "héllo": true, "a\x00b": false, "\xff": false} {
		if got := Storable(s); got != want {
			t.Errorf("Storable(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestCleanMakesEveryStringStorableWithinTheLimit(t *testing.T) {
	for _, in := range []string{"plain", "a\x00b", "bad \xff utf8", strings.Repeat("é", 100), strings.Repeat("x", 100)} {
		for _, limit := range []int{0, 1, 3, 4, 5, 16, 1000} {
			got := Clean(in, limit)
			if !Storable(got) || !utf8.ValidString(got) {
				t.Errorf("Clean(%q, %d) = %q: not storable", in, limit, got)
			}
			if limit > 0 && len(got) > max(limit, len("…")) {
				t.Errorf("Clean(%q, %d) = %d bytes, over the limit", in, limit, len(got))
			}
			if limit == 0 && Storable(in) && got != in {
				t.Errorf("Clean changed the storable %q to %q", in, got)
			}
		}
	}
}
