package client

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
)

// balancerName is the load-balancing policy of every connection the client
// makes: gRPC's round robin over the ready replicas, except that a call
// passes over the replicas its client is avoiding (a replica whose last
// answer was stale, or that ran out the client's deadline) while another
// ready replica is not avoided. When every ready replica is avoided, the
// call takes the next one anyway: avoiding is a preference, never an
// outage.
const balancerName = "kvindex_round_robin"

func init() {
	balancer.Register(base.NewBalancerBuilder(balancerName, pickerBuilder{}, base.Config{}))
}

// avoidSet is a Client's replicas to pass over, by the address the
// resolver gave (host:port), each until a Unix time in nanoseconds. Reads
// (every pick) take no lock: the map is replaced whole on a change, which
// is rare (a replica turning stale or silent).
type avoidSet struct {
	mu sync.Mutex // serializes writers
	m  atomic.Pointer[map[string]int64]
}

// avoided reports whether addr is avoided at now (Unix ns).
func (s *avoidSet) avoided(addr string, now int64) bool {
	m := s.m.Load()
	if m == nil {
		return false
	}
	until, ok := (*m)[addr]
	return ok && now < until
}

// avoid passes over addr until the Unix time until (ns), dropping entries
// that have run out.
func (s *avoidSet) avoid(addr string, now, until int64) {
	if addr == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next := map[string]int64{addr: until}
	if old := s.m.Load(); old != nil {
		for a, u := range *old {
			if a != addr && now < u {
				next[a] = u
			}
		}
	}
	s.m.Store(&next)
}

// forget stops avoiding addr (its answer was fresh again).
func (s *avoidSet) forget(addr string) {
	old := s.m.Load()
	if old == nil {
		return
	}
	if _, ok := (*old)[addr]; !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old = s.m.Load()
	next := make(map[string]int64, len(*old))
	for a, u := range *old {
		if a != addr {
			next[a] = u
		}
	}
	s.m.Store(&next)
}

// pickKey keys a call's *pick in its context.
type pickKey struct{}

// pick carries a client's avoid set to the picker for one call, and brings
// back which replica the call went to (its last attempt's, when gRPC
// retried it) and how many other ready replicas were not avoided then.
type pick struct {
	avoid *avoidSet
	now   func() time.Time

	mu     sync.Mutex
	addr   string
	others int
}

// withPick returns ctx carrying a fresh pick for avoid.
func withPick(ctx context.Context, avoid *avoidSet, now func() time.Time) (context.Context, *pick) {
	p := &pick{avoid: avoid, now: now}
	return context.WithValue(ctx, pickKey{}, p), p
}

// result returns the replica the call went to ("" if none was picked) and
// how many other ready replicas were not avoided when it was.
func (p *pick) result() (addr string, others int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr, p.others
}

type pickerBuilder struct{}

// Build returns a picker over the ready replicas, starting its round at a
// random one (as gRPC's round robin does, so that many clients do not all
// begin with the same replica).
func (pickerBuilder) Build(info base.PickerBuildInfo) balancer.Picker {
	if len(info.ReadySCs) == 0 {
		return base.NewErrPicker(balancer.ErrNoSubConnAvailable)
	}
	p := &picker{}
	for sc, sci := range info.ReadySCs {
		p.subConns = append(p.subConns, sc)
		p.addrs = append(p.addrs, sci.Address.Addr)
	}
	p.next.Store(rand.Uint32())
	return p
}

// picker is round robin over subConns (addrs[i] being subConns[i]'s
// address) that passes over the avoided ones.
type picker struct {
	subConns []balancer.SubConn
	addrs    []string
	next     atomic.Uint32
}

// Pick returns the next ready replica the call's client does not avoid,
// or the next one when it avoids them all (or the call carries no pick).
func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	n := uint32(len(p.subConns))
	start := p.next.Add(1)
	i := start % n
	c, _ := info.Ctx.Value(pickKey{}).(*pick)
	if c == nil {
		return balancer.PickResult{SubConn: p.subConns[i]}, nil
	}
	now := c.now().UnixNano()
	chosen, ok := -1, 0
	for k := range n {
		j := (start + k) % n
		if c.avoid.avoided(p.addrs[j], now) {
			continue
		}
		if chosen < 0 {
			chosen = int(j)
		}
		ok++
	}
	others := 0
	if chosen >= 0 {
		i, others = uint32(chosen), ok-1
	}
	c.mu.Lock()
	c.addr, c.others = p.addrs[i], others
	c.mu.Unlock()
	return balancer.PickResult{SubConn: p.subConns[i]}, nil
}
