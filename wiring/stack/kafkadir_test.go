package stack

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestUnwritableKafkaLogDir: a Kafka log directory the stack cannot write
// fails Start, naming it, before anything serves. The broker itself would
// start and report the failure only in its log, so records it acknowledged
// would be lost. (Here the directory's path is a file: the tests run as
// root, whom a read-only mode does not stop.)
func TestUnwritableKafkaLogDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kafka"), []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{DataDir: dir, EtcdAddr: "127.0.0.1:0", KafkaAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", UnsafeNoFsync: true})
	if err == nil {
		s.close()
		t.Fatal("Start with an unwritable Kafka log directory succeeded")
	}
	if !strings.Contains(err.Error(), "the Kafka log directory") || !strings.Contains(err.Error(), filepath.Join(dir, "kafka")) {
		t.Fatalf("Start = %v, want an error naming the Kafka log directory", err)
	}
}
