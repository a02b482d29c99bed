// Package termsafe escapes text for a terminal: what the outbox shows an
// operator (group names, partition keys, handler errors, payloads) comes
// from messages and may hold characters a terminal acts on instead of
// showing. An escape sequence (ESC, CSI, OSC: "\x1b]0;title\a" retitles
// the window, "\x1b[2J" clears it), a carriage return or line feed (which
// breaks a table row, or overwrites what was printed), or a bidirectional
// override (U+202E shows the rest of the line reversed) is replaced by a
// visible escape: \x1b, \r, \n, \u202e.
//
// Every human-readable output of the outbox command goes through Fprintf
// or a Writer, which escape every argument (never the format, which is the
// program's own); JSON output goes through JSON, which keeps every value
// exact.
package termsafe

import (
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Unsafe reports whether a terminal may act on r instead of showing it, or
// show it so that it hides or reorders the text around it: the C0 controls
// (U+0000–U+001F, tab and line feed included), DEL, the C1 controls
// (U+0080–U+009F), the format characters of Unicode category Cf (the
// bidirectional embeddings, overrides and isolates U+202A–U+202E and
// U+2066–U+2069, the marks U+200E, U+200F and U+061C, zero-width
// characters, the soft hyphen, U+FEFF, ...), and the line and paragraph
// separators U+2028 and U+2029.
func Unsafe(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}

// Safe reports whether s is valid UTF-8 without an Unsafe character, so
// that String returns it unchanged.
func Safe(s string) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size <= 1 || Unsafe(r) {
			return false
		}
		i += size
	}
	return true
}

// String returns s with every Unsafe character replaced by a visible
// escape: \t, \n and \r for tab, line feed and carriage return, \xNN for
// the other C0 controls and DEL, \uNNNN (or \UNNNNNNNN) for the rest; a
// byte that is not valid UTF-8 becomes \xNN too (on its own, a terminal
// may read byte 0x9b as CSI). Everything else, backslashes included, is
// unchanged.
func String(s string) string {
	if Safe(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80 && Unsafe(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xFFFF && Unsafe(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		case Unsafe(r):
			fmt.Fprintf(&b, `\U%08x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// Fprintf formats like fmt.Fprintf, and escapes every argument with String
// after formatting it with its verb (so a struct, a slice or an error is
// escaped whole); format itself is written as it is. Numbers and booleans
// are passed on as they are, so that they can serve as a width or
// precision (%*d).
func Fprintf(w io.Writer, format string, args ...any) (int, error) {
	return fmt.Fprintf(w, format, Args(args)...)
}

// Sprintf is Fprintf into a string.
func Sprintf(format string, args ...any) string {
	return fmt.Sprintf(format, Args(args)...)
}

// Args returns args with each argument that could hold text wrapped so
// that it is escaped when formatted.
func Args(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		if plain(a) {
			out[i] = a
		} else {
			out[i] = escaped{a}
		}
	}
	return out
}

// plain reports whether a is a number or a boolean whose formatting is its
// own (no String, Error or Format method that could return any text).
func plain(a any) bool {
	switch a.(type) {
	case nil, fmt.Formatter, fmt.Stringer, error, fmt.GoStringer:
		return false
	}
	switch reflect.ValueOf(a).Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return true
	}
	return false
}

// escaped formats its value with the verb, flags, width and precision it
// is formatted with, and writes the result escaped.
type escaped struct{ v any }

// The width pads the escaped text, so that columns line up.
func (e escaped) Format(f fmt.State, verb rune) {
	directive := []byte{'%'}
	for _, flag := range "+# " {
		if f.Flag(int(flag)) {
			directive = append(directive, byte(flag))
		}
	}
	if p, ok := f.Precision(); ok {
		directive = append(directive, '.')
		directive = strconv.AppendInt(directive, int64(p), 10)
	}
	directive = utf8.AppendRune(directive, verb)
	s := String(fmt.Sprintf(string(directive), e.v))
	pad := ""
	if w, ok := f.Width(); ok {
		pad = strings.Repeat(" ", max(w-utf8.RuneCountInString(s), 0))
	}
	if f.Flag('-') {
		s += pad
	} else {
		s = pad + s
	}
	_, _ = io.WriteString(f, s)
}

// Writer writes formatted text to an io.Writer with every argument
// escaped (Fprintf). It has no method that writes unescaped values, so a
// table or a message written through it cannot forget to escape one.
type Writer struct{ w io.Writer }

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Printf writes format with every argument escaped; the format's own tabs
// and newlines lay the text out.
func (w *Writer) Printf(format string, args ...any) {
	_, _ = Fprintf(w.w, format, args...)
}

// JSON returns the JSON text b with every Unsafe character escaped as
// \uNNNN (a pair of them beyond U+FFFF): the same JSON value, read by any
// JSON parser, that a terminal shows as it is. encoding/json escapes the
// C0 controls and U+2028/U+2029 itself, but not DEL, the C1 controls or
// the format characters. Outside strings, JSON text is ASCII without
// controls but whitespace, which is left as it is.
func JSON(b []byte) []byte {
	var out []byte
	inString, backslash := false, false
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case !inString:
			if r == '"' {
				inString = true
			}
		case backslash:
			backslash = false
		case r == '\\':
			backslash = true
		case r == '"':
			inString = false
		case Unsafe(r):
			if out == nil {
				out = append(make([]byte, 0, len(b)+16), b[:i]...)
			}
			if r > 0xFFFF {
				r1, r2 := utf16Pair(r)
				out = append(out, fmt.Sprintf(`\u%04x\u%04x`, r1, r2)...)
			} else {
				out = append(out, `\u`...)
				out = append(out, fmt.Sprintf("%04x", r)...)
			}
			i += size
			continue
		}
		if out != nil {
			out = append(out, b[i:i+size]...)
		}
		i += size
	}
	if out == nil {
		return b
	}
	return out
}

// utf16Pair returns the surrogate pair of r (> U+FFFF).
func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xD800 + (r>>10)&0x3FF, 0xDC00 + r&0x3FF
}
