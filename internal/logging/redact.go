package logging

import (
	"net/url"
	"strings"
)

// Redacted is what RedactURL puts in place of a URL's user information.
const Redacted = "REDACTED"

// RedactURL returns addr with any user information (user:password@)
// replaced by "REDACTED@", so an address can be logged or put in an error
// without the credentials an operator may have embedded in it. It reads
// URLs with a scheme ("https://user:pw@etcd:2379") and bare host:port
// forms ("user:pw@broker:9092"); an address without user information is
// returned unchanged.
func RedactURL(addr string) string {
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err == nil {
			if u.User == nil {
				return addr
			}
			u.User = url.User(Redacted)
			return u.String()
		}
		// Unparsable: still cut out anything between the scheme and an @.
		scheme, rest, _ := strings.Cut(addr, "://")
		if i := strings.LastIndex(rest, "@"); i >= 0 {
			return scheme + "://" + Redacted + rest[i:]
		}
		return addr
	}
	if i := strings.LastIndex(addr, "@"); i >= 0 {
		return Redacted + addr[i:]
	}
	return addr
}

// RedactURLs applies RedactURL to each address, returning a new slice.
func RedactURLs(addrs []string) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = RedactURL(a)
	}
	return out
}

// RedactAddress is RedactURL over a comma-separated list of addresses
// (as --index and the slice flags take them), so every address flag has
// one redaction: in errors, log lines and --help defaults alike.
func RedactAddress(list string) string {
	if !strings.Contains(list, ",") {
		return RedactURL(list)
	}
	parts := strings.Split(list, ",")
	for i, p := range parts {
		parts[i] = RedactURL(p)
	}
	return strings.Join(parts, ",")
}
