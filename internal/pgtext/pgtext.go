// Package pgtext checks and cleans Go strings for PostgreSQL text and jsonb
// values, which hold neither invalid UTF-8 nor NUL bytes.
package pgtext

import (
	"strings"
	"unicode/utf8"
)

// Storable reports whether s survives a round trip through a PostgreSQL
// text or jsonb value unchanged.
func Storable(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// Clean makes s storable: invalid UTF-8 and NUL bytes become U+FFFD, and a
// text longer than limit bytes (limit > 0) is cut at a rune boundary and
// ends with "…", all within limit.
func Clean(s string, limit int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	if limit > 0 && len(s) > limit {
		cut := max(limit-len("…"), 0)
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
