package console_test

import (
	"net/http"
	"net/url"
	"testing"

	outbox "github.com/millrace/watermill-outbox"
)

// The scheme of the Authorization header is case-insensitive and may be
// followed by more than one space (RFC 9110, section 11.4); a wrong or
// partial token, or another scheme, is refused.
func TestTheAuthorizationSchemeIsCaseInsensitive(t *testing.T) {
	f := newFixture(t, true)
	csrf := f.csrf(t)
	discard := func(header string) int {
		t.Helper()
		id := itoa(f.addDeadLetter(t, outbox.RejectedMessage{}))
		resp := f.post(t, "/actions/discard", url.Values{"id": {id}, "csrf": {csrf}, "confirm": {"yes"}}, map[string]string{"Authorization": header})
		return resp.StatusCode
	}
	for _, h := range []string{"Bearer " + f.token, "bearer " + f.token, "BEARER " + f.token, "bEaReR " + f.token,
		"Bearer   " + f.token, "bearer " + f.token + "  ", "  Bearer " + f.token,
		"Basic " + basic("ops", f.token), "basic " + basic("ops", f.token), "BASIC   " + basic("", f.token)} {
		if code := discard(h); code != http.StatusSeeOther {
			t.Errorf("Authorization %q: %d, want 303", h, code)
		}
	}
	for _, h := range []string{"", "Bearer", "Bearer ", "bearer nope", "Bearer " + f.token + "x", "Bearer " + f.token[:len(f.token)-1],
		"Token " + f.token, "Bearer" + f.token, f.token, "Bearer\t" + f.token + "\tx", "Basic " + basic(f.token, "nope"),
		"Basic !!!", "Digest " + f.token} {
		if code := discard(h); code != http.StatusUnauthorized {
			t.Errorf("Authorization %q: %d, want 401", h, code)
		}
	}
}
