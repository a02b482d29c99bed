package console

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestVisibleShowsWhatAValueHolds(t *testing.T) {
	for in, want := range map[string]string{
		"billing":                    "billing",
		"line one\nline two\tend":    "line one\nline two\tend",
		"bil\u200bling":              `bil\u200bling`,
		"abc\u202edcba":              `abc\u202edcba`,
		"\u2066x\u2069 \u200e\ufeff": `\u2066x\u2069 \u200e\ufeff`,
		"\x1b]0;owned\a\x1b[2J":      `\x1b]0;owned\x07\x1b[2J`,
		"a\rb\x00c\x7fd\u0085e":      `a\rb\x00c\x7fd\u0085e`,
		"para\u2028graph\u2029":      `para\u2028graph\u2029`,
		"soft\u00adhyphen":           `soft\u00adhyphen`,
		"bad \xff utf-8":             "bad \uFFFD utf-8",
		"tag \U000E0041":             `tag \U000e0041`,
		"ключ ✓ 🙂":                   "ключ ✓ 🙂",
	} {
		if got := visible(in); got != want {
			t.Errorf("visible(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestClipCutsAtCharactersAndKeepsTheWholeWithinBounds(t *testing.T) {
	if c := clip(5, "short"); c.More || c.Short != "short" || c.Full != "" {
		t.Errorf("clip of a short value: %+v", c)
	}
	c := clip(3, "ééééé")
	if !c.More || c.Short != "ééé" || !c.Inline || c.Full != "ééééé" || c.Size != "5 characters" {
		t.Errorf("clip(3, ééééé) = %+v", c)
	}
	long := strings.Repeat("k", inlineMax+1)
	c = clip(10, long)
	if !c.More || c.Inline || c.Full != "" || len(c.Title) != titleMax || c.Size != "65,537 characters, 64.0 KiB" {
		t.Errorf("clip of a value over inlineMax: More %v Inline %v, %d bytes inline, title %d, size %q", c.More, c.Inline, len(c.Full), len(c.Title), c.Size)
	}
	if got := short(4, "abc\u202edef"); got != `abc\…` {
		t.Errorf("short cuts after escaping: %q", got)
	}
	if got := thousands(1234567); got != "1,234,567" {
		t.Errorf("thousands: %q", got)
	}
}

func TestViewPayload(t *testing.T) {
	if v := viewPayload([]byte(`{"a":1}`)); v.Text != `{"a":1}` || v.Cut || v.Binary || v.Size != "7 B" {
		t.Errorf("small payload: %+v", v)
	}
	if v := viewPayload(nil); !v.Empty || v.Text != "" {
		t.Errorf("empty payload: %+v", v)
	}
	if v := viewPayload([]byte{0xff, 0xfe}); !v.Binary || v.Text != "" {
		t.Errorf("binary payload: %+v", v)
	}
	big := []byte(strings.Repeat("x", payloadPreviewBytes-1) + "é" + strings.Repeat("y", 1000))
	v := viewPayload(big)
	if !v.Cut || !utf8.ValidString(v.Text) || len(v.Text) != payloadPreviewBytes-1 || v.Size != "17.0 KiB" {
		t.Errorf("large payload cut at %d bytes (valid UTF-8: %v), size %q", len(v.Text), utf8.ValidString(v.Text), v.Size)
	}
}
