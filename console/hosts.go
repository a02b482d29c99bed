package console

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/millrace/watermill-outbox/outboxtype"
)

// loopbackHosts are the names the console always answers to, at any port:
// a page of another site can never make a browser send them (DNS rebinding
// sends the attacker's own name), and a browser reaching the console under
// them is on the console's machine or in a tunnel to it.
var loopbackHosts = []string{"localhost", "127.0.0.1", "::1"}

// hostRule is one entry of Config.AllowedHosts; port "" matches any port.
type hostRule struct{ host, port string }

// parseHostRule reads "name", "name:port", "10.0.0.5", "::1" or "[::1]:8080".
func parseHostRule(entry string) (hostRule, error) {
	bad := func(reason string) error {
		return &outboxtype.ConfigError{Field: "AllowedHosts", Reason: quoted(100, entry) + ": " + reason}
	}
	host, port := entry, ""
	if h, p, err := net.SplitHostPort(entry); err == nil {
		host, port = h, p
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != p {
			return hostRule{}, bad("the port must be a number from 1 to 65535")
		}
	} else if strings.HasPrefix(entry, "[") && strings.HasSuffix(entry, "]") {
		host = entry[1 : len(entry)-1]
	}
	host = normalHost(host)
	switch {
	case host == "":
		return hostRule{}, bad("empty: give a host name or an IP address, with an optional port (ops.example.com, 10.0.0.5:8080, [::1]:8080)")
	case net.ParseIP(host) != nil:
	case !validHostName(host):
		return hostRule{}, bad("not a host name or an IP address (no scheme, path or wildcard: ops.example.com, 10.0.0.5:8080, [::1]:8080)")
	}
	return hostRule{host: host, port: port}, nil
}

// validHostName reports whether name (lower case, no trailing dot) is a DNS
// name: labels of letters, digits, '-' and '_', at most 253 bytes.
func validHostName(name string) bool {
	if len(name) > 253 {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// normalHost compares host names as a browser does: case-insensitively,
// and "localhost." is "localhost".
// An IP address is compared in its canonical form.
func normalHost(h string) string {
	if ip := net.ParseIP(h); ip != nil {
		return ip.String()
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// hostRules are the rules of Config.AllowedHosts after the loopback names.
func hostRules(entries []string) ([]hostRule, error) {
	rules := make([]hostRule, 0, len(loopbackHosts)+len(entries))
	for _, h := range loopbackHosts {
		rules = append(rules, hostRule{host: h})
	}
	for _, e := range entries {
		r, err := parseHostRule(e)
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// hostAllowed reports whether the request's Host header names the console.
func (c *Console) hostAllowed(r *http.Request) bool {
	host, port := r.Host, ""
	if h, p, err := net.SplitHostPort(r.Host); err == nil {
		host, port = h, p
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	host = normalHost(host)
	if host == "" {
		return false
	}
	for _, rule := range c.hosts {
		if rule.host == host && (rule.port == "" || rule.port == port) {
			return true
		}
	}
	return false
}

// misdirected answers a request for a host the console does not answer to.
func misdirected(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusMisdirectedRequest)
	fmt.Fprintf(w, "421 Misdirected Request: this outbox console does not answer to the host %s.\n"+
		"It answers to localhost, 127.0.0.1 and [::1], and to the hosts it is given: console.Config.AllowedHosts, "+
		"or for outbox serve its --listen address and --allowed-host NAME. If this is how you reach it, add the name there.\n"+
		"The check keeps pages of other sites from reading the console through DNS rebinding.\n", hostText(r.Host))
}

// hostText quotes a Host header for a message: the characters of host
// names and addresses as they are, any other byte as \xNN.
func hostText(host string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(host); i++ {
		c := host[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(".-_:[]", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "\\x%02x", c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// ListenHosts returns the Config.AllowedHosts entry for a console served on
// the listen address addr (host:port, as net.Listen takes it): its host
// with its port, or none for a loopback name (always allowed) or an
// unspecified host ("", 0.0.0.0, [::]), under which no browser reaches it:
// name the hosts it is reached under then.
func ListenHosts(addr string) []string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return nil
	}
	for _, h := range loopbackHosts {
		if normalHost(host) == h {
			return nil
		}
	}
	return []string{net.JoinHostPort(host, port)}
}
