package ingester

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestTooBig: only a refusal of the request itself stops the ingester;
// etcd's own passing states, which it also answers ResourceExhausted
// for, are retried.
func TestTooBig(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"too many ops", rpctypes.ErrGRPCTooManyOps, true},
		{"request too large", rpctypes.ErrGRPCRequestTooLarge, true},
		{"grpc message size", status.Error(codes.ResourceExhausted, "grpc: trying to send message larger than max (3000000 vs. 2097152)"), true},
		{"no space", rpctypes.ErrGRPCNoSpace, false},
		{"too many requests", rpctypes.ErrGRPCRequestTooManyRequests, false},
		{"unavailable", status.Error(codes.Unavailable, "connection refused"), false},
		{"wrapped no space", fmt.Errorf("commit: %w", rpctypes.ErrGRPCNoSpace), false},
	} {
		if got := tooBig(tc.err); got != tc.want {
			t.Errorf("%s: tooBig(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestNoSpaceWaits: with etcd's NOSPACE alarm raised, a running ingester
// keeps its partitions and waits (it used to stop, blaming
// --max-txn-ops); once the alarm is disarmed, the waiting records land.
func TestNoSpaceWaits(t *testing.T) {
	t.Parallel()
	const topic = "nospace"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(40*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-nospace", "/kvindex/nospace/")
	r := start(t, cfg)
	t0 := time.Now()
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "p", t0, 1, 2)}))

	// Raise the alarm as etcd's quota check does when the database is full.
	mc := etcdserverpb.NewMaintenanceClient(e.etcd.Client.ActiveConnection())
	st, err := e.etcd.Client.Status(ctx, e.etcd.Client.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	alarm := &etcdserverpb.AlarmRequest{Action: etcdserverpb.AlarmRequest_ACTIVATE, MemberID: st.Header.MemberId, Alarm: etcdserverpb.AlarmType_NOSPACE}
	if _, err := mc.Alarm(ctx, alarm); err != nil {
		t.Fatalf("raising NOSPACE: %v", err)
	}
	if _, err := e.etcd.Client.Put(ctx, "/probe", "x"); !errors.Is(rpctypes.Error(err), rpctypes.ErrNoSpace) {
		t.Fatalf("a put under the alarm: %v, want NOSPACE", err)
	}
	want := ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "p", t0.Add(time.Second), 3)})

	// Several retries' worth: the ingester must still be running.
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	err = r.wait(wctx)
	wcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("under NOSPACE the ingester stopped: %v", err)
	}
	got, _, err := ingesttest.StoredOffsets(ctx, e.etcd.Client, cfg.Keyspace, topic)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] > want[0] {
		t.Fatalf("stored offset %d under NOSPACE, past the held record's %d", got[0], want[0])
	}

	alarm.Action = etcdserverpb.AlarmRequest_DEACTIVATE
	if _, err := mc.Alarm(ctx, alarm); err != nil {
		t.Fatalf("disarming NOSPACE: %v", err)
	}
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, want)
	if _, n := present(t, ctx, e, cfg.Keyspace, "p"); n != 3 {
		t.Errorf("blocks after the alarm = %d, want 3", n)
	}
}
