package console

import "testing"

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0:                   "0 B",
		1023:                "1023 B",
		1024:                "1.0 KiB",
		1536:                "1.5 KiB",
		5 << 20:             "5.0 MiB",
		3<<30 + 1<<29:       "3.5 GiB",
		1 << 62:             "4.0 EiB",
		9223372036854775807: "8.0 EiB",
	} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
