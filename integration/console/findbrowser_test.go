package console

import (
	"errors"
	"strings"
	"testing"
)

// Without Chromium the browser tests are skipped for a contributor and fail
// in CI; with it they run.
func TestMissingChromiumSkipsLocallyAndFailsInCI(t *testing.T) {
	none := func(string) (string, error) { return "", errors.New("not found") }
	chromium := func(name string) (string, error) {
		if name == "chromium" {
			return "/usr/bin/chromium", nil
		}
		return "", errors.New("not found")
	}
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, c := range []struct {
		name            string
		look            func(string) (string, error)
		getenv          func(string) string
		found, required bool
		says            string
	}{
		{"contributor without a browser", none, env(), false, false, "OUTBOX_REQUIRE_BROWSER=1"},
		{"CI without a browser", none, env("CI", "true"), false, true, "apt-get install chromium"},
		{"required without a browser", none, env("OUTBOX_REQUIRE_BROWSER", "1"), false, true, "apt-get install chromium"},
		{"CI with Chromium", chromium, env("CI", "true"), true, false, ""},
		{"contributor with Chromium", chromium, env(), true, false, ""},
	} {
		found, msg := findBrowser(c.look, c.getenv)
		if found != c.found || msg.required != c.required || !strings.Contains(msg.text, c.says) {
			t.Errorf("%s: found %v, %+v; want found %v, required %v, saying %q", c.name, found, msg, c.found, c.required, c.says)
		}
	}
}
