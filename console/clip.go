package console

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// What a page shows of one value. A message's payload, key, metadata and
// error, and the names of groups and topics in dead letters, have no limit
// that keeps a page readable: a page shows the first characters of each
// and a way to the whole.
const (
	// inlineMax is the largest value a page carries whole behind its
	// "show all" (the full text, in a box of bounded height); a longer one
	// is only named, and the CLI's -o json output has it.
	inlineMax = 64 << 10
	// payloadPreviewBytes is how much of a payload the dead-letter page
	// shows; the download link has the rest.
	payloadPreviewBytes = 16 << 10
	// titleMax bounds a tooltip that holds a clipped name whole.
	titleMax = 1024
)

// clipped is a value shortened for a page.
type clipped struct {
	Short  string // the first characters; the whole value unless More
	More   bool   // the value is longer than Short
	Full   string // the whole value, when More and Inline
	Inline bool   // the whole value is at most inlineMax bytes
	Title  string // the value for a tooltip, at most titleMax characters
	Size   string // how long the whole value is, for "show all"
}

// clip shortens s to its first n characters (runes), shown visible.
func clip(n int, s string) clipped {
	s = visible(s)
	head, more := cut(s, n)
	c := clipped{Short: head, More: more}
	if more {
		c.Inline = len(s) <= inlineMax
		if c.Inline {
			c.Full = s
		}
		c.Title, _ = cut(s, titleMax)
		chars := utf8.RuneCountInString(s)
		c.Size = fmt.Sprintf("%s characters", thousands(chars))
		if !c.Inline {
			c.Size = fmt.Sprintf("%s characters, %s", thousands(chars), humanBytes(int64(len(s))))
		}
	}
	return c
}

// short is s cut to its first n characters, with "…" when cut, shown
// visible.
func short(n int, s string) string {
	head, more := cut(visible(s), n)
	if more {
		return head + "…"
	}
	return head
}

// quoted is s cut to its first n characters and quoted, every character a
// page would not show as itself escaped: for a value named in a sentence.
func quoted(n int, s string) string {
	head, more := cut(s, n)
	if more {
		return strconv.QuoteToGraphic(head) + "…"
	}
	return strconv.QuoteToGraphic(head)
}

// cut returns the first n runes of s and whether s is longer.
func cut(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	i := 0
	for k := 0; k < n && i < len(s); k++ {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return s[:i], i < len(s)
}

// thousands writes n with thousands separators: 54,321.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// payloadView is what the dead-letter page shows of a payload.
type payloadView struct {
	Text   string // the payload as text, or its first payloadPreviewBytes
	Binary bool   // not UTF-8: no text is shown
	Cut    bool   // Text is not the whole payload
	Shown  string // the size of Text, readable, when Cut
	Size   string // the payload's size, readable
	Empty  bool
}

// viewPayload shows a payload as text when it is UTF-8, its first
// payloadPreviewBytes when it is longer.
func viewPayload(b []byte) payloadView {
	v := payloadView{Size: humanBytes(int64(len(b))), Empty: len(b) == 0}
	if !utf8.Valid(b) {
		v.Binary = true
		return v
	}
	if len(b) <= payloadPreviewBytes {
		v.Text = visible(string(b))
		return v
	}
	end := payloadPreviewBytes
	for end > 0 && !utf8.RuneStart(b[end]) {
		end--
	}
	v.Text, v.Cut, v.Shown = visible(string(b[:end])), true, humanBytes(int64(end))
	return v
}

// hidden reports whether a page would not show r as itself: a control
// character other than tab and line feed (which HTML shows as white
// space), or one that hides or reorders the text around it: the format
// characters of category Cf (bidirectional overrides and isolates such as
// U+202E, zero-width characters, the soft hyphen, U+FEFF, ...) and the
// line and paragraph separators. "bil\u200bling" would look like the
// group "billing", and U+202E shows the rest of a value reversed.
func hidden(r rune) bool {
	return r != '\n' && r != '\t' && unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}

// visible returns s with every hidden character written as an escape
// (\x1b, \r, \u202e), and invalid UTF-8 as U+FFFD, so that what a page
// shows is what the value holds. The page's forms keep the exact values.
func visible(s string) string {
	clean := utf8.ValidString(s)
	for _, r := range s {
		if !clean || hidden(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		switch {
		case !hidden(r):
			b.WriteRune(r)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xFFFF:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	return b.String()
}
