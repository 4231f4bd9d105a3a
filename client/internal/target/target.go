// Package target checks the gRPC targets of indexd that client.New takes,
// so that the client and the cell map (client/cellmap) refuse the same
// slips in the same words.
package target

import (
	"fmt"
	"net"
	"strings"
)

// Check refuses the targets client.New cannot mean: empty, an HTTP URL (a
// common slip for gRPC's host:port), or a comma-separated list with no
// address or an element that is not host:port. A single target is left
// to gRPC's own parsing (its forms include a host without a port).
func Check(target string) error {
	switch {
	case target == "":
		return fmt.Errorf("empty target")
	case strings.HasPrefix(target, "http://"), strings.HasPrefix(target, "https://"):
		return fmt.Errorf("target %q is a URL; give host:port or dns:///host:port", target)
	case strings.Contains(target, "://") || !strings.Contains(target, ","):
		return nil
	}
	n := 0
	for _, a := range strings.Split(target, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return fmt.Errorf("target %q: %q is not host:port", target, a)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("target %q names no address", target)
	}
	return nil
}
