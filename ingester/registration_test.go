package ingester

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestCleanStopRevokesRegistration: after a clean stop, ingesters/{ID} is
// gone at once (its lease revoked), not a TTL later, and stopping logs no
// etcd client warning. The ingester's etcd client logs to an observer, as
// a real one logs to the process's log.
func TestCleanStopRevokesRegistration(t *testing.T) {
	const topic = "register"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	core, logs := observer.New(zap.WarnLevel)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   e.etcd.Endpoints,
		DialTimeout: testutil.Timeout(5 * time.Second),
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Logger:      zap.New(core),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cfg := e.config(t, topic, "g-register", "/kvindex/register/")
	cfg.Etcd = cli
	cfg.ID = "ingester-a"
	r := start(t, cfg)
	r.waitOwned(t, ctx, 1)
	key := cfg.Keyspace.IngesterKey(cfg.ID)
	var lease int64
	ingesttest.WaitFor(t, ctx, e.etcd.Client, cfg.Keyspace.IngestersPrefix(), "the ingester to register its partition", func() bool {
		resp, err := e.etcd.Client.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 || !strings.Contains(string(resp.Kvs[0].Value), topic+"/0") {
			return false
		}
		lease = resp.Kvs[0].Lease
		return true
	})

	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	resp, err := e.etcd.Client.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Errorf("%s is still there after a clean stop, want it gone with its lease", key)
	}
	ttl, err := e.etcd.Client.TimeToLive(ctx, clientv3.LeaseID(lease))
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL > 0 {
		t.Errorf("registration lease %x has %d s left after a clean stop, want it revoked", lease, ttl.TTL)
	}
	for _, l := range logs.All() {
		t.Errorf("etcd client logged %q on a clean stop: %v", l.Message, l.ContextMap())
	}
}

// TestRegistrationSurvivesLeaseLoss: when the registration lease goes
// behind the ingester's back (revoked here, as etcd expires a lease nobody
// could renew), the ingester registers again on a new lease.
func TestRegistrationSurvivesLeaseLoss(t *testing.T) {
	t.Parallel()
	const topic = "reregister"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-reregister", "/kvindex/reregister/")
	shortLeases(&cfg)
	cfg.ID = "ingester-b"
	start(t, cfg)
	key := cfg.Keyspace.IngesterKey(cfg.ID)
	lease := func() int64 {
		resp, err := e.etcd.Client.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return 0
		}
		return resp.Kvs[0].Lease
	}
	var first int64
	ingesttest.WaitFor(t, ctx, e.etcd.Client, cfg.Keyspace.IngestersPrefix(), "the ingester to register", func() bool {
		first = lease()
		return first != 0
	})
	if _, err := e.etcd.Client.Revoke(ctx, clientv3.LeaseID(first)); err != nil {
		t.Fatal(err)
	}
	ingesttest.WaitFor(t, ctx, e.etcd.Client, cfg.Keyspace.IngestersPrefix(), "the ingester to register again", func() bool {
		l := lease()
		return l != 0 && l != first
	})
}
