package termsafe

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// hostile holds what a message can carry to an operator's terminal: an OSC
// that retitles the window, a CSI that clears it, a bell, CR/LF, tab, DEL,
// C1 CSI (as a character and as a lone byte), the bidi override and
// isolates, marks, zero-width characters, a tag character, separators.
const hostile = "a\x1b]0;pwned\a\x1b[2J\r\nb\tc\x7f\u009b31m\x9b\u202Ed\u2066\u2069\u200E\u200F\u061C\u200B\u00AD\uFEFF\U000E0041\u2028\u2029"

func TestStringLeavesNoUnsafeCharacter(t *testing.T) {
	got := String(hostile)
	for i, r := range got {
		if Unsafe(r) || r == utf8.RuneError {
			t.Fatalf("String(%q) = %q: %U at byte %d", hostile, got, r, i)
		}
	}
	want := `a\x1b]0;pwned\x07\x1b[2J\r\nb\tc\x7f\u009b31m\x9b\u202ed\u2066\u2069\u200e\u200f\u061c\u200b\u00ad\ufeff\U000e0041\u2028\u2029`
	if got != want {
		t.Fatalf("String(hostile)\n got %s\nwant %s", got, want)
	}
}

func TestStringKeepsPrintableText(t *testing.T) {
	for _, s := range []string{"", "billing", `C:\path\x1b`, "héllo wörld", "日本語", "emoji 🙂", "\uFFFD", "arabic مرحبا"} {
		if got := String(s); got != s {
			t.Errorf("String(%q) = %q, want it unchanged", s, got)
		}
		if !Safe(s) {
			t.Errorf("Safe(%q) = false", s)
		}
	}
}

func TestEveryCategoryIsUnsafe(t *testing.T) {
	for _, r := range []rune{0, 0x07, 0x09, 0x0a, 0x0d, 0x1b, 0x1f, 0x7f, 0x80, 0x85, 0x9b, 0x9f,
		0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069, 0x200E, 0x200F, 0x061C,
		0x200B, 0x200D, 0x2060, 0xFEFF, 0x00AD, 0xE0001, 0x2028, 0x2029} {
		if !Unsafe(r) {
			t.Errorf("Unsafe(%U) = false", r)
		}
	}
	for _, r := range []rune{' ', 'a', '~', 0xA0, 'é', 0x3000, 0xFFFD, 0x1F642} {
		if Unsafe(r) {
			t.Errorf("Unsafe(%U) = true", r)
		}
	}
}

type stringer struct{}

func (stringer) String() string { return "from\x1b[2JString" }

type key struct{ Name string }

func TestFprintfEscapesEveryArgumentNotTheFormat(t *testing.T) {
	var b bytes.Buffer
	_, _ = Fprintf(&b, "%s\t%q\t%v\t%d\t%*d\t%.1f\t%v\t%s\t%+v\t%v\n",
		"g\r\nx", "k\u202E", errors.New("err\x1b]0;t\a"), 42, 3, 7, 1.25, []string{"a\nb"}, stringer{}, key{"n\x1b"}, true)
	want := "g\\r\\nx\t\"k\\u202e\"\terr\\x1b]0;t\\x07\t42\t  7\t1.2\t[a\\nb]\tfrom\\x1b[2JString\t{Name:n\\x1b}\ttrue\n"
	if b.String() != want {
		t.Fatalf("Fprintf:\n got %q\nwant %q", b.String(), want)
	}
	var w bytes.Buffer
	NewWriter(&w).Printf("%-6s|\n", "a\tb")
	if w.String() != "a\\tb  |\n" {
		t.Fatalf("Writer.Printf with a width: %q", w.String())
	}
}

func TestJSONIsTheSameValueWithNothingUnsafe(t *testing.T) {
	valid := strings.Replace(hostile, "m\x9b", "m", 1) // JSON holds no lone byte
	v := map[string]any{"group": valid, "nested": []string{"x\u202Ey", "\U000E0041"}, "plain": `q"uo\te`}
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	safe := JSON(raw)
	if !utf8.Valid(safe) {
		t.Fatalf("JSON made invalid UTF-8: %q", safe)
	}
	for _, r := range string(safe) {
		if Unsafe(r) {
			t.Fatalf("JSON left %U in %s", r, safe)
		}
	}
	var back map[string]any
	if err := json.Unmarshal(safe, &back); err != nil {
		t.Fatalf("%v\n%s", err, safe)
	}
	again, _ := json.Marshal(back)
	if !bytes.Equal(again, raw) {
		t.Fatalf("JSON changed the value:\n%s\n%s", raw, again)
	}
	if plain := []byte(`{"a":"b","c":[1,2]}`); !bytes.Equal(JSON(plain), plain) {
		t.Fatal("JSON changed safe JSON")
	}
	if !strings.Contains(string(safe), `\u202e`) {
		t.Fatalf("no \\u202e escape in %s", safe)
	}
}
