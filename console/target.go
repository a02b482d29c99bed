package console

import (
	"net/url"
	"path"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxTargetLen bounds a way back: a longer one is not a page of the console.
const maxTargetLen = 2048

// localTarget returns raw, a way back that a page passes along ("back") to
// the confirmation page and the action, when it is a page of the console
// itself, and the overview ("/") otherwise. Every link and redirect made
// from request input goes through it, so none leaves the console.
//
// raw is relative to the mount prefix (the console's own pages carry their
// path without it) and must be a clean absolute path: one leading slash
// and no "//", no "." or ".." segment, no backslash, no whitespace or
// control character (a browser drops TAB, CR and LF from a URL, so
// "/\t/evil" is "//evil" to it), nothing but printable ASCII (the console's
// own paths are percent-encoded), no fragment. The same holds for the path
// decoded, as often as it decodes ("/%2F/evil", "/%5Cevil", "/%09/evil",
// "/%252F%252Fevil" are refused), except that a decoded space is allowed:
// a browser never decodes a path, and group names may have spaces. The
// query is kept in its canonical encoding.
func localTarget(raw string) string {
	if t, ok := cleanTarget(raw); ok {
		return t
	}
	return "/"
}

// cleanTarget is localTarget's check: the canonical target and whether raw
// is one.
func cleanTarget(raw string) (string, bool) {
	if raw == "" || len(raw) > maxTargetLen {
		return "", false
	}
	for i := 0; i < len(raw); i++ {
		if c := raw[i]; c <= ' ' || c >= 0x7f || c == '\\' || c == '#' {
			return "", false
		}
	}
	p, q, hasQuery := strings.Cut(raw, "?")
	for decoded, round := p, 0; ; round++ {
		if !cleanPath(decoded) {
			return "", false
		}
		next, err := url.PathUnescape(decoded)
		if err != nil && round == 0 {
			return "", false // not a valid encoding
		}
		if err != nil || next == decoded {
			break // a name with a '%' of its own, or nothing left to decode
		}
		decoded = next
	}
	if !hasQuery {
		return p, true
	}
	values, err := url.ParseQuery(q)
	if err != nil {
		return "", false
	}
	if len(values) == 0 {
		return p, true
	}
	return p + "?" + values.Encode(), true
}

// cleanPath reports whether p is an absolute path with one leading slash,
// no empty, "." or ".." segment (a trailing slash aside), valid UTF-8 of
// printable characters (the space included) other than backslash.
func cleanPath(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || !utf8.ValidString(p) {
		return false
	}
	for _, r := range p {
		if r == '\\' || !unicode.IsPrint(r) {
			return false
		}
	}
	clean := path.Clean(p)
	return clean == p || (clean+"/" == p && clean != "/")
}

// validPrefix reports whether prefix is a mount prefix the console can put
// in front of its paths: "" or a clean absolute path without a trailing
// slash, query or fragment.
func validPrefix(prefix string) bool {
	if prefix == "" {
		return true
	}
	t, ok := cleanTarget(prefix)
	return ok && t == prefix && !strings.HasSuffix(prefix, "/") && !strings.Contains(prefix, "?")
}

// withFlash returns target (a result of localTarget) with the flash message
// and its MAC as its only flash parameters.
func withFlash(target, flash, mac string) string {
	p, q, _ := strings.Cut(target, "?")
	values, _ := url.ParseQuery(q)
	values.Set("flash", flash)
	values.Set("flash_mac", mac)
	return p + "?" + values.Encode()
}
