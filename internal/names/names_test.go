package names

import (
	"errors"
	"strings"
	"testing"

	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func TestGroupRefusesWhatATerminalWouldActOn(t *testing.T) {
	for _, name := range []string{
		"", strings.Repeat("g", MaxGroupLen+1), "bad\xffutf8", "a\x00b",
		"x\x1b]0;pwned\a", "x\x1b[2J", "billing\r\nfake-row", "tab\there", "del\x7f", "c1\u009b",
		"\u202Egnillib", "iso\u2066late\u2069", "mark\u200E", "alm\u061C", "zero\u200Bwidth", "bom\uFEFF", "sep\u2028",
	} {
		err := Group(name)
		var ne *outboxtype.NameError
		if !errors.Is(err, sentinel.ErrInvalidName) || !errors.As(err, &ne) || ne.Kind != "group" || ne.Name != name {
			t.Errorf("Group(%q) = %v, want a *NameError of kind group", name, err)
		}
	}
	if err := Group("x\x1b]0;t"); !strings.Contains(err.Error(), "U+001B at byte 1") {
		t.Errorf("the error does not name the character and where: %v", err)
	}
}

func TestGroupAcceptsPrintableNames(t *testing.T) {
	for _, name := range []string{"billing", "forward-to-kafka", "Billing Team", "équipe.facturation", "請求", "g:1/2", strings.Repeat("g", MaxGroupLen)} {
		if err := Group(name); err != nil {
			t.Errorf("Group(%q) = %v", name, err)
		}
	}
}

func TestTopicRefusesControlAndFormatCharacters(t *testing.T) {
	for _, name := range []string{"orders\x1b[2J", "orders\r\n", "\u202Eorders", "ord\u200Bers"} {
		if err := Topic(name); !errors.Is(err, sentinel.ErrInvalidName) {
			t.Errorf("Topic(%q) = %v, want ErrInvalidName", name, err)
		}
	}
}

func TestSourceAcceptsShardNamesAndRefusesSeparators(t *testing.T) {
	for _, name := range []string{"eu", "shard-07", "tenant_3.primary", strings.Repeat("s", MaxSourceLen)} {
		if err := Source(name); err != nil {
			t.Errorf("Source(%q) = %v", name, err)
		}
	}
	for _, name := range []string{"", strings.Repeat("s", MaxSourceLen+1), "a/b", "a=b", "eu west", "eu\x1b[2J", "é", ".", ".."} {
		var ne *outboxtype.NameError
		if err := Source(name); !errors.As(err, &ne) || ne.Kind != "source" || !errors.Is(err, sentinel.ErrInvalidName) {
			t.Errorf("Source(%q) = %v, want a *NameError of kind source", name, err)
		}
	}
}
