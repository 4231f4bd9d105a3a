package etcdembed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
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

// TestDataDirInUse: a second server on a data dir another holds fails at
// once with ErrDataDirInUse (etcd alone waits on its database lock for
// ever, deaf to the context), and the dir is free again after Close.
func TestDataDirInUse(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "etcd")
	cfg := Config{DataDir: dir, ClientAddr: "127.0.0.1:0", UnsafeNoFsync: true}
	first, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		s   *Server
		err error
	}
	second := make(chan result, 1)
	go func() {
		s, err := Start(ctx, cfg)
		second <- result{s, err}
	}()
	select {
	case r := <-second:
		if r.s != nil {
			r.s.Close()
		}
		if !errors.Is(r.err, ErrDataDirInUse) || !strings.Contains(r.err.Error(), dir) {
			t.Fatalf("second Start on a held data dir = %v, want ErrDataDirInUse naming %s", r.err, dir)
		}
	case <-time.After(30 * time.Second):
		first.Close() // lets the blocked Start go on, so the test can end
		t.Fatal("second Start on a held data dir still waiting after 30 s, want ErrDataDirInUse at once")
	}
	first.Close()

	again, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start after the holder closed: %v, want the dir free", err)
	}
	again.Close()
}

// TestStartCancelledIsQuiet: a context cancelled while etcd starts (Ctrl-C
// at startup) fails Start with the context's error, and etcd's complaints
// about its own listeners closing stay out of the log.
func TestStartCancelledIsQuiet(t *testing.T) {
	var logs bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Start(ctx, Config{
		DataDir: filepath.Join(t.TempDir(), "etcd"), ClientAddr: "127.0.0.1:0", UnsafeNoFsync: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with a cancelled context = %v, want context.Canceled", err)
	}
	if logs.Len() != 0 {
		t.Fatalf("Start with a cancelled context logged:\n%s", logs.String())
	}
}
