package indexd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// Server is an indexd replica: the reflector that keeps the index in step
// with etcd, and the gRPC server (kvindex.v1.IndexService, the gRPC health
// service, reflection with Config.Reflection) that answers from
// it, over TLS when Config.TLS is set. With a health port
// (Config.HealthListenAddr) a second, plaintext gRPC server answers
// grpc.health.v1 only, with the same statuses.
//
// Shutdown order (Run, when its context ends): the health service turns
// NOT_SERVING and ends its Watch streams; the health port stops; the gRPC server stops taking calls and lets in-flight ones
// finish for up to ShutdownGrace, then closes what is left; the reflector's
// watch is cancelled. The index stays readable to the end.
type Server struct {
	kvindexv1.UnsafeIndexServiceServer

	cfg  Config
	lis  net.Listener
	grpc *grpc.Server
	// healthLis and healthGRPC serve the plaintext health port; nil
	// without one.
	healthLis  net.Listener
	healthGRPC *grpc.Server
	health     *health.Server
	// stopping is cancelled when shutdown begins; it ends health watches
	// and barrier waits (ErrStopping).
	stopping     context.Context
	stopHealthFn context.CancelFunc
	refl         *reflector
	bcst         *broadcaster
	m            *metrics
	ready        atomic.Bool
	pool         sync.Pool // *index.Scratch
	ran          atomic.Bool
	// healthMu orders the kvindex.v1.IndexService status changes;
	// staleHealth is whether staleness has set it NOT_SERVING.
	healthMu    sync.Mutex
	staleHealth bool

	// waiters counts the Lookups holding a barrier slot (acquireWaiter).
	waiters atomic.Int64
	// inflight counts the blocks of the Lookups being answered (admit).
	inflight atomic.Int64
	// leftOutLogged is when a token Lookup last logged the endpoints it
	// left out (Unix nanoseconds; leftOutLogEvery apart).
	leftOutLogged atomic.Int64
}

// leftOutLogEvery is the least time between two WARNs about endpoints a
// token Lookup left out; kvindex_indexd_token_lookup_left_out_total counts
// every one.
const leftOutLogEvery = time.Minute

// serviceName is the gRPC health service name of the API.
const serviceName = "kvindex.v1.IndexService"

// New validates cfg and binds the gRPC listener (cfg.Listener, or a new
// one on cfg.ListenAddr), so Addr is known before Run. It errors with
// ErrInvalidConfig, or when the address cannot be bound.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.Logger == nil {
		cfg.Logger = logging.Discard()
	}
	lis := cfg.Listener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
			return nil, fmt.Errorf("indexd: listening on %s: %w", cfg.ListenAddr, err)
		}
	}
	healthLis := cfg.HealthListener
	if healthLis == nil && cfg.HealthListenAddr != "" {
		var err error
		if healthLis, err = net.Listen("tcp", cfg.HealthListenAddr); err != nil {
			lis.Close()
			return nil, fmt.Errorf("indexd: listening on %s (health): %w", cfg.HealthListenAddr, err)
		}
	}
	lis = limitListener(lis, cfg.MaxConnections)
	if healthLis != nil {
		healthLis = limitListener(healthLis, cfg.HealthMaxConnections)
	}
	s := &Server{cfg: cfg, lis: lis, healthLis: healthLis, health: health.NewServer(), bcst: newBroadcaster()}
	s.stopping, s.stopHealthFn = context.WithCancel(context.Background())
	s.pool.New = func() any { return new(index.Scratch) }
	s.refl = &reflector{cli: cfg.Etcd, ks: cfg.Keyspace, cfg: cfg, log: cfg.Logger, bcst: s.bcst, onReady: s.setReady}
	s.m = newMetrics(cfg.Registry, s.refl.current, func() float64 { return s.refl.progressAge().Seconds() })
	s.refl.m = s.m
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(serviceName, healthpb.HealthCheckResponse_NOT_SERVING)
	opts := append(connOptions(cfg, s.m.requestReadTimeouts.Inc),
		grpc.MaxRecvMsgSize(transportLimit(cfg.MaxRequestBytes)),
		grpc.MaxConcurrentStreams(uint32(cfg.MaxConcurrentStreams)),
		grpc.ForceServerCodecV2(newDeferredCodec(cfg)),
	)
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	s.grpc = grpc.NewServer(opts...)
	desc := s.serviceDesc()
	s.grpc.RegisterService(&desc, s)
	hs := &healthService{Server: s.health, stopping: s.stopping}
	healthpb.RegisterHealthServer(s.grpc, hs)
	if cfg.Reflection {
		reflection.Register(s.grpc)
	}
	if healthLis != nil {
		// Only health on this port: it is plaintext and reachable by the
		// kubelet, so it must not answer Lookup or describe the API.
		s.healthGRPC = grpc.NewServer(append(connOptions(cfg, s.m.requestReadTimeouts.Inc), grpc.MaxRecvMsgSize(healthRequestLimit), grpc.MaxConcurrentStreams(healthMaxStreams))...)
		healthpb.RegisterHealthServer(s.healthGRPC, checkOnly{hs})
	}
	return s, nil
}

// Health port limits: a health check is a service name, a probe needs a
// stream or two.
const (
	healthRequestLimit = 4 << 10
	healthMaxStreams   = 16
)

// Addr is the address the gRPC API is served on.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// HealthAddr is the address of the plaintext health port, or nil when
// there is none (Config.HealthListener, HealthListenAddr).
func (s *Server) HealthAddr() net.Addr {
	if s.healthLis == nil {
		return nil
	}
	return s.healthLis.Addr()
}

// Ready returns nil once the first list of etcd has been applied (the
// replica then serves), else an error wrapping ErrNotReady; with
// MaxStaleness set, it also fails, wrapping ErrStale, while the last
// progress from etcd is older than that (gRPC health stays SERVING: the
// replica still answers, from its last state). It suits opsserver's
// /readyz.
func (s *Server) Ready() error {
	if !s.ready.Load() {
		return ErrNotReady
	}
	if limit := s.cfg.MaxStaleness; limit > 0 {
		if age := s.refl.progressAge(); age > limit {
			return fmt.Errorf("%w: no progress from etcd for %s, over --max-staleness %s", ErrStale, age.Round(time.Millisecond), limit)
		}
	}
	return nil
}

func (s *Server) setReady() {
	s.healthMu.Lock()
	s.ready.Store(true)
	s.m.ready.Set(1)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(serviceName, healthpb.HealthCheckResponse_SERVING)
	s.staleHealth = false
	s.healthMu.Unlock()
	s.cfg.Logger.Info("indexd ready", "addr", s.Addr().String(), "revision", s.refl.current().Revision())
}

// ServeIndex makes the replica answer from ix instead of the index it
// listed, until the reflector publishes its next list (a re-list after a
// compaction); watched events keep going to the listed index, not to ix.
// It exists for the benchmarks of this module (bench), which
// serve indexes of millions of entries without loading them into etcd;
// ix's type is internal to the module. A nil ix is ignored.
func (s *Server) ServeIndex(ix *index.Index) {
	if ix == nil {
		return
	}
	s.refl.cur.Store(ix)
	s.bcst.broadcast()
}

// Run serves until ctx ends, then shuts down in the order the type's doc
// gives and returns nil; it returns an error when serving fails. Call it
// once.
func (s *Server) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("indexd: Run called twice")
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.refl.run(gctx) })
	g.Go(func() error {
		s.refl.monitor(gctx)
		return nil
	})
	g.Go(func() error {
		s.watchStaleness(gctx)
		return nil
	})
	g.Go(func() error {
		// ErrServerStopped is our own stop reaching the server before
		// Serve did (ctx done at once): a shutdown, not a failure.
		if err := s.grpc.Serve(s.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("indexd: serving gRPC on %s: %w", s.Addr(), err)
		}
		return nil
	})
	if s.healthGRPC != nil {
		g.Go(func() error {
			if err := s.healthGRPC.Serve(s.healthLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("indexd: serving health on %s: %w", s.HealthAddr(), err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		s.stop()
		return nil
	})
	s.cfg.Logger.Info("indexd serving", "addr", s.Addr().String(), "prefix", s.cfg.Keyspace.Prefix())
	return g.Wait()
}

// stop shuts the gRPC side down: NOT_SERVING, then GracefulStop bounded by
// ShutdownGrace, then Stop.
func (s *Server) stop() {
	s.health.Shutdown()
	s.stopHealthFn()
	if s.healthGRPC != nil {
		// Its calls are unary checks and Watch streams, which stopHealthFn
		// has just ended: nothing to wait for.
		s.healthGRPC.Stop()
	}
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(s.cfg.ShutdownGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.cfg.Logger.Warn("graceful stop timed out, closing remaining calls", "grace", s.cfg.ShutdownGrace)
		s.grpc.Stop()
		<-done
	}
}

// serviceDesc is the generated IndexService descriptor with every method
// wrapped to count and time calls (decode failures included, which never
// reach an interceptor) and to answer a request that does not decode with
// INVALID_ARGUMENT (deferredCodec).
func (s *Server) serviceDesc() grpc.ServiceDesc {
	desc := kvindexv1.IndexService_ServiceDesc
	desc.Methods = slices.Clone(desc.Methods)
	for i := range desc.Methods {
		name, h := desc.Methods[i].MethodName, desc.Methods[i].Handler
		desc.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			start := time.Now()
			resp, err := h(srv, ctx, decodeRequest(name, dec), icpt)
			s.m.requests.WithLabelValues(name, status.Code(err).String()).Inc()
			s.m.requestSeconds.WithLabelValues(name).Observe(time.Since(start).Seconds())
			return resp, err
		}
	}
	return desc
}

// transportLimit is the gRPC receive limit for a MaxRequestBytes of n:
// requests up to twice the limit are read and answered INVALID_ARGUMENT
// naming the limit (gRPC itself can only answer RESOURCE_EXHAUSTED, and
// writes that status before any handler runs); larger ones gRPC refuses
// unread.
func transportLimit(n int) int { return 2 * n }

// checkSize reports a request whose encoding exceeds MaxRequestBytes.
func (s *Server) checkSize(req proto.Message) error {
	if n := proto.Size(req); n > s.cfg.MaxRequestBytes {
		return errTooLarge(n, s.cfg.MaxRequestBytes)
	}
	return nil
}

// Lookup implements kvindex.v1.IndexService/Lookup (DESIGN semantics 5,
// candidate filter, read-your-events barrier). A request with tokens is a
// token Lookup (DESIGN "Hashing", readers): the prompt is keyed once per
// block size among the candidate endpoints in token mode, each of which
// is matched with the keys of its own block size.
func (s *Server) Lookup(ctx context.Context, req *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	resp, err := s.lookup(ctx, req)
	return resp, toStatus(err)
}

func (s *Server) lookup(ctx context.Context, req *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	records, timeout, err := s.validateLookup(req)
	if err != nil {
		return nil, err
	}
	// The progress time is read before the index: the state the lookup
	// then sees is at least as new as that progress.
	progress := s.refl.progressTime()
	ix := s.refl.current()
	if ix == nil {
		return nil, ErrNotReady
	}
	if len(records) > 0 {
		// Waiting is bounded on its own (MaxBarrierWaiters); the
		// in-flight budget counts the lookup work after it.
		if ix, err = s.waitBarrier(ctx, records, timeout); err != nil {
			return nil, err
		}
		// After a wait, a newer progress applies when ix still serves
		// (it is then the live index the reflector writes to).
		if p := s.refl.progressTime(); s.refl.current() == ix {
			progress = p
		}
	}
	release, err := s.admit(lookupCost(req))
	if err != nil {
		return nil, err
	}
	defer release()
	var cands []keyspace.Endpoint
	if len(req.Candidates) > 0 {
		cands = make([]keyspace.Endpoint, len(req.Candidates))
		for i, c := range req.Candidates {
			cands[i] = keyspace.Endpoint{Pod: c.Pod, Rank: c.DpRank}
		}
	}
	sc := s.pool.Get().(*index.Scratch)
	defer s.pool.Put(sc)
	if req.Tokens != nil {
		ix.LookupTokens(sc, req.Model, tokenKeyer(req.Tokens), cands)
		if sc.LeftOut > 0 {
			s.leftOut(req.Model, sc)
		}
	} else {
		ix.Lookup(sc, req.Model, req.BlockHashes, cands)
	}
	resp := lookupResponse(sc)
	if !progress.IsZero() {
		resp.ProgressTime = timestamppb.New(progress)
	}
	return resp, nil
}

// leftOut counts the endpoints a token Lookup of model left out (their
// block size was not among the index.MaxTokenBlockSizes it keyed at) and
// logs a WARN at most every leftOutLogEvery.
func (s *Server) leftOut(model string, sc *index.Scratch) {
	s.m.tokenLeftOut.Add(float64(sc.LeftOut))
	now := time.Now().UnixNano()
	last := s.leftOutLogged.Load()
	if now-last < int64(leftOutLogEvery) || !s.leftOutLogged.CompareAndSwap(last, now) {
		return
	}
	s.cfg.Logger.Warn("token Lookup left endpoints out: their model's endpoints have more block sizes than one Lookup keys at",
		"model", model, "endpoints_left_out", sc.LeftOut, "sizes_left_out", sc.LeftOutSizes,
		"sizes_kept", index.MaxTokenBlockSizes, "kept", "the sizes whose endpoints hold the most blocks")
}

// tokensPerBlockCost is the block size a token Lookup's cost assumes: the
// smallest block size engines commonly run (vLLM's default is 16), so a
// token prompt costs at least as many blocks as it can have at any
// common size.
const tokensPerBlockCost = 16

// lookupCost is a Lookup's work in blocks (Config.MaxInFlightBlocks): its
// block hashes, or its token prompt's tokens / tokensPerBlockCost, and at
// least 1.
func lookupCost(req *kvindexv1.LookupRequest) int64 {
	n := len(req.BlockHashes) + (len(req.GetTokens().GetTokenIds())+tokensPerBlockCost-1)/tokensPerBlockCost
	return int64(max(n, 1))
}

// admit takes n blocks of the server-wide in-flight budget, or fails with
// ErrOverloaded when that would pass MaxInFlightBlocks. The caller runs
// release when its answer is built.
func (s *Server) admit(n int64) (release func(), err error) {
	limit := int64(s.cfg.MaxInFlightBlocks)
	for {
		cur := s.inflight.Load()
		if cur+n > limit {
			return nil, fmt.Errorf("%w: %d blocks are being looked up and this Lookup adds %d; the limit is %d blocks in flight (--max-inflight-blocks)",
				ErrOverloaded, cur, n, limit)
		}
		if s.inflight.CompareAndSwap(cur, cur+n) {
			s.m.inflightBlocks.Add(float64(n))
			return func() {
				s.inflight.Add(-n)
				s.m.inflightBlocks.Sub(float64(n))
			}, nil
		}
	}
}

// lookupResponse copies a Lookup result out of its scratch into a
// response, in a handful of allocations.
func lookupResponse(sc *index.Scratch) *kvindexv1.LookupResponse {
	resp := &kvindexv1.LookupResponse{Revision: sc.Revision}
	if n := len(sc.Matches); n > 0 {
		total := 0
		for _, m := range sc.Matches {
			total += m.Blocks
		}
		tiers := make([]kvindexv1.Tier, total)
		ms := make([]kvindexv1.EndpointMatch, n)
		eps := make([]kvindexv1.Endpoint, n)
		resp.Matches = make([]*kvindexv1.EndpointMatch, n)
		for i, m := range sc.Matches {
			ts := tiers[:m.Blocks:m.Blocks]
			tiers = tiers[m.Blocks:]
			for j, t := range m.Tiers {
				ts[j] = kvindexv1.Tier(t)
			}
			eps[i].Pod, eps[i].DpRank = m.Endpoint.Pod, m.Endpoint.Rank
			ms[i].Endpoint, ms[i].MatchedBlocks, ms[i].Tiers, ms[i].BlockSize = &eps[i], uint32(m.Blocks), ts, m.BlockSize
			resp.Matches[i] = &ms[i]
		}
	}
	if n := len(sc.Offsets); n > 0 {
		offs := make([]kvindexv1.PartitionOffset, n)
		resp.AppliedOffsets = make([]*kvindexv1.PartitionOffset, n)
		for i, o := range sc.Offsets {
			offs[i].Topic, offs[i].Partition, offs[i].Offset = o.Partition.Topic, o.Partition.Partition, o.Next
			resp.AppliedOffsets[i] = &offs[i]
		}
	}
	return resp
}

// validateLookup checks req against the API's rules and the limits, and
// returns the barrier's records (largest offset per partition, in Next)
// and timeout.
func (s *Server) validateLookup(req *kvindexv1.LookupRequest) ([]index.PartitionOffset, time.Duration, error) {
	if err := s.checkSize(req); err != nil {
		return nil, 0, err
	}
	if req.Model == "" {
		return nil, 0, fmt.Errorf("%w: model is required", ErrInvalidArgument)
	}
	if err := keyspace.ValidateName("model", req.Model); err != nil {
		return nil, 0, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if n := len(req.BlockHashes); n > s.cfg.MaxHashes {
		return nil, 0, fmt.Errorf("%w: block_hashes has %d hashes, the limit is %d per request (--max-hashes)",
			ErrInvalidArgument, n, s.cfg.MaxHashes)
	}
	if err := s.validateTokens(req); err != nil {
		return nil, 0, err
	}
	if n := len(req.Candidates); n > s.cfg.MaxCandidates {
		return nil, 0, errTooManyCandidates(n, s.cfg.MaxCandidates)
	}
	for i, c := range req.Candidates {
		if err := keyspace.ValidateName("pod", c.GetPod()); err != nil {
			return nil, 0, fmt.Errorf("%w: candidates[%d]: %v", ErrInvalidArgument, i, err)
		}
	}
	b := req.Barrier
	if b == nil || len(b.Records) == 0 {
		return nil, 0, nil
	}
	if n := len(b.Records); n > s.cfg.MaxBarrierRecords {
		return nil, 0, errTooManyRecords(n, s.cfg.MaxBarrierRecords)
	}
	timeout := s.cfg.BarrierTimeout
	if b.Timeout != nil {
		if err := b.Timeout.CheckValid(); err != nil {
			return nil, 0, fmt.Errorf("%w: barrier timeout: %v", ErrInvalidArgument, err)
		}
		switch d := b.Timeout.AsDuration(); {
		case d < 0:
			return nil, 0, fmt.Errorf("%w: barrier timeout %s is negative", ErrInvalidArgument, d)
		case d > s.cfg.MaxBarrierTimeout:
			return nil, 0, fmt.Errorf("%w: barrier timeout %s exceeds the limit of %s", ErrInvalidArgument, d, s.cfg.MaxBarrierTimeout)
		case d > 0:
			timeout = d
		}
	}
	records := make([]index.PartitionOffset, 0, len(b.Records))
	for i, r := range b.Records {
		if err := keyspace.ValidateName("topic", r.GetTopic()); err != nil {
			return nil, 0, fmt.Errorf("%w: barrier records[%d]: %v", ErrInvalidArgument, i, err)
		}
		if r.Partition < 0 || r.Offset < 0 {
			return nil, 0, fmt.Errorf("%w: barrier records[%d]: partition %d and offset %d must not be negative",
				ErrInvalidArgument, i, r.Partition, r.Offset)
		}
		p := keyspace.Partition{Topic: r.Topic, Partition: r.Partition}
		if j := slices.IndexFunc(records, func(o index.PartitionOffset) bool { return o.Partition == p }); j >= 0 {
			records[j].Next = max(records[j].Next, r.Offset)
			continue
		}
		records = append(records, index.PartitionOffset{Partition: p, Next: r.Offset})
	}
	return records, timeout, nil
}

// Server implements the generated service interface. It embeds the
// Unsafe (not the Unimplemented) marker, so adding an RPC to the API fails
// the build here until it is implemented.
var _ kvindexv1.IndexServiceServer = (*Server)(nil)
