package enginesim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
)

// samePortTries bounds ListenSamePort: how many ports it tries before it
// gives up because another host's bind kept finding the port taken.
const samePortTries = 20

// ListenSamePort opens one TCP listener on each of hosts, all on the same
// port: the port the kernel picks for hosts[0] (bound on port 0). It is
// how a test gives several simulated pods one replay port, as a bridge's
// --replay-pattern tcp://{host}:PORT expects, without handing a picked
// port to a later bind: every listener is open when it returns (pass each
// as Config.ReplayListener). When the picked port is taken on another
// host, it closes what it opened and picks again, up to 20 times, then
// returns the last error. On error no listener is left open.
func ListenSamePort(ctx context.Context, hosts []string) ([]net.Listener, int, error) {
	if len(hosts) == 0 {
		return nil, 0, errors.New("enginesim: ListenSamePort needs at least one host")
	}
	var lc net.ListenConfig
	var lastErr error
	for range samePortTries {
		first, err := lc.Listen(ctx, "tcp", net.JoinHostPort(hosts[0], "0"))
		if err != nil {
			return nil, 0, fmt.Errorf("enginesim: listening on %s: %w", hosts[0], err)
		}
		port := first.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{first}
		for _, h := range hosts[1:] {
			l, err := lc.Listen(ctx, "tcp", net.JoinHostPort(h, strconv.Itoa(port)))
			if err != nil {
				lastErr = err
				break
			}
			ls = append(ls, l)
		}
		if len(ls) == len(hosts) {
			return ls, port, nil
		}
		for _, l := range ls {
			l.Close()
		}
		if !errors.Is(lastErr, syscall.EADDRINUSE) {
			return nil, 0, fmt.Errorf("enginesim: listening on port %d of every host: %w", port, lastErr)
		}
	}
	return nil, 0, fmt.Errorf("enginesim: no port free on every host after %d tries: %w", samePortTries, lastErr)
}
