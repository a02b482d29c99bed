package console_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// The scheme of the Authorization header is case-insensitive and may be
// followed by more than one space (RFC 9110, section 11.4); a wrong or
// partial token, or another scheme, is refused.
func TestTheAuthorizationSchemeIsCaseInsensitive(t *testing.T) {
	f := consoletest.New(t, true)
	csrf := f.CSRF(t)
	discard := func(header string) int {
		t.Helper()
		id := consoletest.Itoa(f.AddDeadLetter(t, outboxtype.RejectedMessage{}))
		resp := f.Post(t, "/actions/discard", url.Values{"id": {id}, "csrf": {csrf}, "confirm": {"yes"}}, map[string]string{"Authorization": header})
		return resp.StatusCode
	}
	for _, h := range []string{"Bearer " + f.Token, "bearer " + f.Token, "BEARER " + f.Token, "bEaReR " + f.Token,
		"Bearer   " + f.Token, "bearer " + f.Token + "  ", "  Bearer " + f.Token,
		"Basic " + basic("ops", f.Token), "basic " + basic("ops", f.Token), "BASIC   " + basic("", f.Token)} {
		if code := discard(h); code != http.StatusSeeOther {
			t.Errorf("Authorization %q: %d, want 303", h, code)
		}
	}
	for _, h := range []string{"", "Bearer", "Bearer ", "bearer nope", "Bearer " + f.Token + "x", "Bearer " + f.Token[:len(f.Token)-1],
		"Token " + f.Token, "Bearer" + f.Token, f.Token, "Bearer\t" + f.Token + "\tx", "Basic " + basic(f.Token, "nope"),
		"Basic !!!", "Digest " + f.Token} {
		if code := discard(h); code != http.StatusUnauthorized {
			t.Errorf("Authorization %q: %d, want 401", h, code)
		}
	}
}
