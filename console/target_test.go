package console

import (
	"net/url"
	"strings"
	"testing"
)

// Every way back a page, a link or a form can hand the console: only a
// clean path on the console itself is kept, anything else becomes the
// overview.
func TestLocalTargetKeepsOnlyPathsOnTheConsole(t *testing.T) {
	kept := map[string]string{
		"/":                                 "/",
		"/dlq":                              "/dlq",
		"/dlq/":                             "/dlq/",
		"/dlq/42":                           "/dlq/42",
		"/dlq?group=billing&status=pending": "/dlq?group=billing&status=pending",
		"/dlq?status=pending&group=billing": "/dlq?group=billing&status=pending", // canonical query
		"/dlq?":                             "/dlq",
		"/groups/orders/billing":            "/groups/orders/billing",
		"/groups/orders/a%2Fb":              "/groups/orders/a%2Fb",              // a group named a/b
		"/groups/orders/caf%C3%A9":          "/groups/orders/caf%C3%A9",          // café
		"/groups/orders/order%20processing": "/groups/orders/order%20processing", // a group with a space
		"/groups/orders/100%25":             "/groups/orders/100%25",             // 100%: decodes once
		"/dlq?group=%5C%2F%2Fevil.example":  "/dlq?group=%5C%2F%2Fevil.example",  // a query value is only a value
		"/dlq?back=//evil.example":          "/dlq?back=%2F%2Fevil.example",
		"/@evil.example":                    "/@evil.example", // a path on the console, not a userinfo
		"/javascript:alert(1)":              "/javascript:alert(1)",
		"/dlq?flash=done&flash_mac=00":      "/dlq?flash=done&flash_mac=00",
		"/" + strings.Repeat("a", 2000):     "/" + strings.Repeat("a", 2000),
		"/groups/orders/" + url.PathEscape("ключ"): "/groups/orders/" + url.PathEscape("ключ"),
	}
	for in, want := range kept {
		if got := localTarget(in); got != want {
			t.Errorf("localTarget(%q) = %q, want %q", in, got, want)
		}
	}
	refused := []string{
		"", "dlq", "./dlq", "../dlq", "?flash=x", "#x",
		// another host
		"//evil.example", "//evil.example/x", "///evil.example", "////evil.example",
		"https://evil.example", "http:evil.example", "http:/evil.example", "HTTPS://evil.example/x", "//evil.example:443/",
		"javascript:alert(1)", "JaVaScRiPt:alert(1)", "data:text/html,<script>alert(1)</script>", "vbscript:x",
		// backslashes, which a browser reads as slashes
		`/\evil.example`, `\/evil.example`, `\\evil.example`, `/\/evil.example`, `/dlq\..\..\x`,
		// whitespace and control characters a browser strips or mangles
		"/\t/evil.example", "/\n/evil.example", "/\r/evil.example", "/\r\n/evil.example", "\t//evil.example",
		" //evil.example", "/ /evil.example", "/dlq ", "/\x00/evil.example", "/\x7f/evil.example", "/\x0b/evil.example",
		"/dlq?x=\t", "/dlq?x=a b", `/dlq?x=\`,
		// non-ASCII, which the console's own paths never carry unencoded
		"/\u00a0/evil.example", "/\u3000/evil.example", "/\u202e/evil.example", "/／evil.example", "/＼evil.example",
		// encoded variants
		"/%2F/evil.example", "/%2f/evil.example", "/%2F%2Fevil.example", "/%5Cevil.example", "/%5cevil.example",
		"/%09/evil.example", "/%0A/evil.example", "/%0d%0a/evil.example", "/%00/evil.example", "/%7F/evil.example",
		"/%252F%252Fevil.example", "/%25252F/evil.example", "/%255Cevil.example", "/%25%32%46/evil.example",
		"/%C2%A0/evil.example", "/%E2%80%AE/evil.example", "/%FF", "/%", "/%zz", "/dlq?x=%zz", "/dlq?a;b",
		// dot segments and empty segments
		"/./../evil.example", "/../evil.example", "/..", "/.", "/dlq/..", "/dlq/.", "/dlq/../..", "/a//b",
		"/%2e%2e/evil.example", "/%2E%2E%2Fevil.example", "/%2e/x", "/dlq/%2e%2e",
		// fragments, and what is too long to be a page of the console
		"/dlq#x", "/dlq?a=b#c", "/" + strings.Repeat("a", 3000), "/dlq?x=" + strings.Repeat("a", 3000),
	}
	for _, in := range refused {
		if got := localTarget(in); got != "/" {
			t.Errorf("localTarget(%q) = %q, want the overview", in, got)
		}
	}
}

func TestValidPrefix(t *testing.T) {
	for prefix, want := range map[string]bool{
		"": true, "/outbox": true, "/ops/outbox": true, "/outbox-1.2": true,
		"/": false, "outbox": false, "/outbox/": false, "//evil.example": false, `/\evil.example`: false,
		"/a/../b": false, "/a/./b": false, "/a?x=1": false, "/a#x": false, "/a b": false, "/a\tb": false,
		"https://evil.example": false, "/%2F/evil.example": false,
	} {
		if got := validPrefix(prefix); got != want {
			t.Errorf("validPrefix(%q) = %v, want %v", prefix, got, want)
		}
	}
}

func TestWithFlashReplacesTheFlash(t *testing.T) {
	for in, want := range map[string]string{
		"/":                                  "/?flash=done&flash_mac=m",
		"/dlq?status=pending":                "/dlq?flash=done&flash_mac=m&status=pending",
		"/dlq?flash=old&flash_mac=x&status=": "/dlq?flash=done&flash_mac=m&status=",
	} {
		if got := withFlash(in, "done", "m"); got != want {
			t.Errorf("withFlash(%q) = %q, want %q", in, got, want)
		}
	}
}
