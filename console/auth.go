package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
)

// authorized says whether r may run an action: Config.Authorize decides
// when set, else the token it carries must be Config.Token.
func (c *Console) authorized(r *http.Request) bool {
	if c.cfg.Authorize != nil {
		return c.cfg.Authorize(r)
	}
	given := credential(r.Header.Get("Authorization"))
	if given == "" {
		return false
	}
	// Compared as digests: the same length whatever was sent.
	a, b := sha256.Sum256([]byte(given)), sha256.Sum256([]byte(c.cfg.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// credential is the token an Authorization header carries: a Bearer token,
// or the password of Basic credentials. The scheme is case-insensitive and
// may be followed by more than one space (RFC 9110, section 11.4).
func credential(header string) string {
	scheme, rest, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok {
		return ""
	}
	rest = strings.TrimSpace(rest)
	switch {
	case strings.EqualFold(scheme, "Bearer"):
		return rest
	case strings.EqualFold(scheme, "Basic"):
		decoded, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return ""
		}
		_, pw, ok := strings.Cut(string(decoded), ":")
		if !ok {
			return ""
		}
		return pw
	}
	return ""
}

// sameOrigin refuses a request whose Origin (or, without one, Referer)
// names another host.
func (c *Console) sameOrigin(r *http.Request) bool {
	src := r.Header.Get("Origin")
	if src == "" || src == "null" {
		src = r.Header.Get("Referer")
	}
	if src == "" {
		return r.Header.Get("Sec-Fetch-Site") == "" || r.Header.Get("Sec-Fetch-Site") == "same-origin"
	}
	u, err := url.Parse(src)
	return err == nil && u.Host == r.Host
}

func (c *Console) csrfToken() string {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte("outbox console actions"))
	return hex.EncodeToString(m.Sum(nil))
}

// mac authenticates a value the console hands to the browser and reads
// back (purpose keeps the uses apart).
func (c *Console) mac(purpose, value string) string {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte("outbox console " + purpose + "\x00" + value))
	return hex.EncodeToString(m.Sum(nil)[:16])
}
