package stack

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/etcdembed"
)

// TestNestedDataDirRefused: a second stack's data dir inside a first
// stack's etcd data or Kafka log is refused before anything starts, and
// nothing is created there; the first stack's own dir, a sibling and a
// dir that only looks alike are not. The first stack need not run: its
// files are there either way.
func TestNestedDataDirRefused(t *testing.T) {
	first := t.TempDir()
	for _, d := range []string{"etcd/member/wal", "kafka"} {
		if err := os.MkdirAll(filepath.Join(first, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(first, "etcd", etcdembed.LockFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	lookalike := t.TempDir() // a "kafka" dir with no stack's etcd beside it
	for _, tc := range []struct {
		dir    string
		nested bool
	}{
		{filepath.Join(first, "etcd"), true},
		{filepath.Join(first, "etcd", "member", "wal", "deeper"), true},
		{filepath.Join(first, "kafka"), true},
		{filepath.Join(first, "kafka", "x"), true},
		{first, false},
		{filepath.Join(first, "other"), false},
		{filepath.Join(lookalike, "kafka", "x"), false},
	} {
		err := checkNotNested(tc.dir)
		if got := errors.Is(err, ErrNestedDataDir); got != tc.nested {
			t.Errorf("checkNotNested(%s) = %v, want nested %v", tc.dir, err, tc.nested)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Join(first, "etcd", "second")
	s, err := Start(ctx, Config{DataDir: dir, EtcdAddr: "127.0.0.1:0", KafkaAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", UnsafeNoFsync: true})
	if err == nil {
		s.close()
		t.Fatal("Start inside another stack's etcd data dir succeeded")
	}
	if !errors.Is(err, ErrNestedDataDir) {
		t.Fatalf("Start = %v, want ErrNestedDataDir", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s after the refusal: %v, want nothing created", dir, err)
	}
}

// TestDataDirInUseNamedBeforePorts: a second stack on a data dir in use,
// with the first one's addresses (a second `make run`), fails naming the
// data dir, not a taken port. Before, it named the etcd port, and after
// that one was changed the Kafka port, then the gRPC one, and only then
// the data dir.
func TestDataDirInUseNamedBeforePorts(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := Start(ctx, Config{DataDir: dir, EtcdAddr: "127.0.0.1:0", KafkaAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer first.close()
	etcdAddr := strings.TrimPrefix(first.EtcdURL(), "http://")
	s, err := Start(ctx, Config{DataDir: dir, EtcdAddr: etcdAddr, KafkaAddr: first.KafkaAddr(), GRPCAddr: first.GRPCAddr(), MetricsAddr: first.MetricsAddr(), UnsafeNoFsync: true})
	if err == nil {
		s.close()
		t.Fatal("a second stack started on a data dir in use")
	}
	var ae *AddrError
	if !errors.Is(err, etcdembed.ErrDataDirInUse) || errors.As(err, &ae) {
		t.Fatalf("second Start = %v, want ErrDataDirInUse before any taken address", err)
	}
}
