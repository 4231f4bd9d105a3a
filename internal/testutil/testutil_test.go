package testutil

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, LeakOptions()...) }

func TestEtcdAndKafkaStart(t *testing.T) {
	e := StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), Timeout(10*time.Second))
	defer cancel()
	if _, err := e.Client.Put(ctx, "/k", "v"); err != nil {
		t.Fatal(err)
	}
	resp, err := e.Client.Get(ctx, "/k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get: %v %v", resp, err)
	}
	k := StartKafka(t, "t", 2)
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Key: []byte("a"), Value: []byte("b")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	fs := cl.PollFetches(ctx)
	if errs := fs.Errors(); len(errs) > 0 {
		t.Fatal(errs)
	}
	if n := fs.NumRecords(); n != 1 {
		t.Fatalf("fetched %d records, want 1", n)
	}
}
