package sim

import "testing"

// TestHashTextIsPostgreSQLs pins hashText to PostgreSQL 15's hashtext (the
// values were read from a server: SELECT hashtext(...)); integration/sim
// checks more against a live server.
func TestHashTextIsPostgreSQLs(t *testing.T) {
	for in, want := range map[string]int32{
		"m1:0":                    1271276286,
		"":                        -1477818771,
		"abcdefghijkl":            -1586087212,
		"member-xyz-123456789:15": 1472587740,
		"a":                       1075015857,
	} {
		if got := hashText(in); got != want {
			t.Errorf("hashText(%q) = %d, PostgreSQL says %d", in, got, want)
		}
	}
}
