package testutil

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Kafka is a running in-process kfake broker.
type Kafka struct {
	Cluster *kfake.Cluster
	// Brokers are the seed addresses.
	Brokers []string
}

// StartKafka starts a one-broker kfake cluster with topic pre-created with
// partitions partitions, stopped by t.Cleanup.
func StartKafka(t testing.TB, topic string, partitions int32, opts ...kfake.Opt) *Kafka {
	t.Helper()
	all := append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic)}, opts...)
	c, err := kfake.NewCluster(all...)
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return &Kafka{Cluster: c, Brokers: c.ListenAddrs()}
}
