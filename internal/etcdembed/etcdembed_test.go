package etcdembed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestAddrInUse: a second listen on a taken port is recognised (Start
// picks again only for that), other errors are not; and a fixed client
// port that is taken fails Start with ErrAddrInUse instead of retrying.
func TestAddrInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = net.Listen("tcp", l.Addr().String())
	if err == nil {
		t.Fatal("a second listen on a taken port succeeded")
	}
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{err, true},
		{fmt.Errorf("etcdembed: start: %w", err), true},
		{errors.New("etcdembed: DataDir is required"), false},
		{context.DeadlineExceeded, false},
	} {
		if got := addrInUse(tt.err); got != tt.want {
			t.Errorf("addrInUse(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1:0": true, "127.0.0.1:2379": false, "bad": false} {
		if got := portZero(addr); got != want {
			t.Errorf("portZero(%q) = %v, want %v", addr, got, want)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = Start(ctx, Config{DataDir: filepath.Join(t.TempDir(), "etcd"), ClientAddr: l.Addr().String(), PeerAddr: "127.0.0.1:0"})
	if !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("Start on a taken fixed client port = %v, want ErrAddrInUse", err)
	}
}
