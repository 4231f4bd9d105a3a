package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvindex/kvindex/client/internal/target"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// Defaults of the options.
const (
	// DefaultTimeout is the per-call deadline when the caller's context has
	// none sooner.
	DefaultTimeout = time.Second
	// DefaultMaxAttempts is how many times a call is tried when replicas
	// answer UNAVAILABLE (gRPC caps it at 5).
	DefaultMaxAttempts = 3
	// KeepaliveTime is how long a connection to a replica may carry
	// nothing before the client pings it, and KeepaliveTimeout how long it
	// waits for the ping's answer before it closes the connection (gRPC's
	// keepalive.ClientParameters), so a replica that stopped answering
	// (a stopped process, a node gone dark) loses its connection within
	// 25 s even with no call in flight. indexd lets clients ping every
	// 10 s at most (its --keepalive-min-time default); a shorter interval
	// would be answered with GOAWAY. WithDialOptions can set others.
	KeepaliveTime    = 20 * time.Second
	KeepaliveTimeout = 5 * time.Second
)

// Tier is the memory tier of a matched block; the values are the API's
// (kvindex.v1.Tier). Lower is better.
type Tier int32

// The tiers.
const (
	TierUnspecified Tier = 0
	TierGPU         Tier = 1
	TierCPU         Tier = 2
	TierDisk        Tier = 3
)

// String returns "gpu", "cpu", "disk" or "unspecified".
func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierCPU:
		return "cpu"
	case TierDisk:
		return "disk"
	}
	return "unspecified"
}

// Endpoint identifies one KV cache: a pod (as its model server's KV event
// records name it) and a data-parallel rank.
type Endpoint struct {
	Pod    string
	DPRank uint32
}

// Match is one endpoint's share of a looked-up prefix: its first Blocks
// blocks are all present on it, Tiers[i] being the best tier of block i.
// BlockSize is the endpoint's block size in tokens as its endpoint record
// states it (0 when unknown); a LookupTokens match was keyed at exactly
// this size, so Blocks × BlockSize prompt tokens are cached there.
type Match struct {
	Endpoint  Endpoint
	Blocks    int
	Tiers     []Tier
	BlockSize int
}

// PartitionOffset names a position in a Kafka partition. In a barrier,
// Offset is the offset of a produced record; in a result it is the next
// offset to consume (every record below it is reflected).
type PartitionOffset struct {
	Topic     string
	Partition int32
	Offset    int64
}

// LookupResult is a Lookup answer. It reflects exactly etcd revision
// Revision and the partitions' AppliedOffsets (see the package doc).
type LookupResult struct {
	// Matches lists the endpoints holding at least the first block,
	// ordered by Blocks descending, then pod, then rank.
	Matches        []Match
	Revision       int64
	AppliedOffsets []PartitionOffset
	// ProgressTime is when the answering replica last heard from etcd
	// that its watch was current: the answer is at most
	// time.Since(ProgressTime) stale. Zero when the replica did not say
	// (before its first progress, or a replica older than the field).
	// In cell mode, the oldest of the answering cells' (zero when any is).
	ProgressTime time.Time
	// Cells (cell mode only) are the cells that answered, in the route's
	// order, each with its own revision and offsets: revisions of two
	// cells' etcd clusters are not comparable, so Revision is the one
	// cell's when one answered and 0 when several did, and AppliedOffsets
	// lists every answering cell's partitions (each cell has its topic).
	Cells []CellAnswer
	// Failed (cell mode only) are the cells that did not answer in time
	// or failed; the matches are the other cells'. Non-empty means the
	// answer is partial (Partial).
	Failed []CellError
	// Duplicates (cell mode only) counts endpoints more than one cell
	// reported (only while a model moves between cells): the copy of the
	// cell the map writes the pod to is kept.
	Duplicates int
}

// Partial reports whether some cell of the model did not answer (Failed).
func (r *LookupResult) Partial() bool { return len(r.Failed) > 0 }

// HashMode is how an endpoint's block keys were computed; the values are
// the API's (kvindex.v1.HashMode).
type HashMode int32

// The hash modes (DESIGN "Hashing").
const (
	// HashModeUnspecified is an endpoint without a (readable) record.
	HashModeUnspecified HashMode = 0
	// HashModeToken keys are kvindex's canonical keys (TokenKeys): look
	// the endpoint up with LookupTokens, or with TokenKeys at its
	// BlockSize.
	HashModeToken HashMode = 1
	// HashModeEngine keys are the engine's own block hashes (for vLLM
	// with sha256_cbor, Hasher's).
	HashModeEngine HashMode = 2
)

// String returns "token", "engine" or "unspecified".
func (m HashMode) String() string {
	switch m {
	case HashModeToken:
		return "token"
	case HashModeEngine:
		return "engine"
	}
	return "unspecified"
}

// EndpointInfo describes an endpoint the index knows.
type EndpointInfo struct {
	Model    string
	Endpoint Endpoint
	// GPUBlocks, CPUBlocks and DiskBlocks count its blocks per tier.
	GPUBlocks, CPUBlocks, DiskBlocks uint64
	// LastSeen is the time of its last KV event batch or heartbeat (zero
	// when it has no endpoint record).
	LastSeen time.Time
	// BlockSize is the engine's block size in tokens, 0 when unknown.
	BlockSize uint32
	// Partition is the Kafka partition its records arrive on.
	Partition int32
	// HashMode is how its block keys were computed.
	HashMode HashMode
	// Cell is the cell that listed it (cell mode only; "" otherwise).
	Cell string
}

// EndpointList is a whole ListEndpoints answer, ordered by model, pod,
// rank, gathered page by page (ListEndpointsPage).
//
// Each page reflects one etcd revision of the replica that answered it, so
// a list of several pages may mix revisions: an endpoint that appeared
// meanwhile ahead of the pages already read is missing, and one that went
// away after its page was read is still listed. Revision and MaxRevision
// say how far apart the pages are; they are equal when the list is one
// snapshot (always when it fit in one page).
type EndpointList struct {
	Endpoints []EndpointInfo
	// Revision is the lowest etcd revision among the pages: every page
	// reflects at least this revision.
	Revision int64
	// MaxRevision is the highest etcd revision among the pages.
	MaxRevision int64
	// Pages is how many ListEndpoints calls the list took.
	Pages int
}

// EndpointPage is one page of a ListEndpoints answer (ListEndpointsPage).
type EndpointPage struct {
	// Endpoints are ordered by model, pod, rank, after the endpoint the
	// request's page token named.
	Endpoints []EndpointInfo
	// Revision is the etcd revision this page reflects.
	Revision int64
	// NextPageToken continues the list; empty when this page is the last.
	NextPageToken string
}

// Client calls indexd replicas, balancing calls round-robin over them.
// It is safe for concurrent use.
type Client struct {
	conn    *grpc.ClientConn
	api     kvindexv1.IndexServiceClient
	timeout time.Duration
	closed  atomic.Bool
	// dnsHost is the host name a dns target resolves ("" for other
	// targets), to explain a call that found no address (explain).
	dnsHost string
	// staleAfter and maxAttempts drive the search for a fresh answer
	// (lookupFresh); avoid holds the replicas calls pass over meanwhile
	// (balancer.go).
	staleAfter  time.Duration
	maxAttempts int
	avoid       avoidSet
	now         func() time.Time
	// cells is set in cell mode (WithCells); conn and api are nil then.
	cells *cellSet
}

// Option configures New.
type Option func(*options)

type options struct {
	timeout     time.Duration
	maxAttempts int
	staleAfter  time.Duration
	dialOpts    []grpc.DialOption
	tls         tlsOptions
	cells       CellSource
	cellsGiven  bool // WithCells was given, even with nil
}

// WithTimeout sets the per-call deadline applied when the caller's context
// has none sooner. A call that runs out this deadline (or a caller's of at
// least half of it) makes the Client avoid the replica it went to, as a stale
// one (WithStaleAfter), so a replica that holds its connection open but
// does not answer fails one call per WithStaleAfter, not its share of the
// load. Default DefaultTimeout (1 s); zero or less keeps the default.
func WithTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// WithMaxAttempts sets how many times a call is tried in all when replicas
// answer UNAVAILABLE (and only then), each retry going to the next replica.
// Default 3; values are clamped to [1, 5] (gRPC's limit).
func WithMaxAttempts(n int) Option {
	return func(o *options) { o.maxAttempts = min(max(n, 1), 5) }
}

// WithDialOptions adds gRPC dial options. Transport credentials given here
// take the place of the WithTLS options' (the default is plaintext, as
// indexd serves by default).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// staticSeq names each static resolver uniquely.
var staticSeq atomic.Uint64

// New returns a client for target, which is one of:
//
//   - a gRPC target with a scheme, such as "dns:///indexd.kvindex:50051"
//     (a headless Service: every replica's address);
//   - a comma-separated list of host:port, such as "10.0.0.1:50051,10.0.0.2:50051";
//   - one host:port (resolved through DNS).
//
// Calls are balanced round-robin over the resolved replicas and retried on
// UNAVAILABLE only. New does not connect; the first call does. It errors
// (ErrInvalidArgument) for an empty target, an http or https URL (give
// host:port), a comma-separated list with no address or an element that
// is not host:port, and for TLS files (WithTLSCAFile, WithTLSCertFiles) it
// cannot load.
//
// With WithCells the target must be empty: the client serves every cell
// of the map (see the package doc's "Cells"), each through a connection
// of its own built with the same options.
func New(target string, opts ...Option) (*Client, error) {
	o := options{timeout: DefaultTimeout, maxAttempts: DefaultMaxAttempts, staleAfter: DefaultStaleAfter}
	for _, opt := range opts {
		opt(&o)
	}
	target = strings.TrimSpace(target)
	if o.cellsGiven && o.cells == nil {
		return nil, fmt.Errorf("%w: WithCells with a nil cell source", ErrInvalidArgument)
	}
	if o.cells != nil {
		if target != "" {
			return nil, fmt.Errorf("%w: a target (%q) and a cell map given together", ErrInvalidArgument, target)
		}
		if o.cells.Current() == nil {
			return nil, fmt.Errorf("%w: the cell source has no map", ErrInvalidArgument)
		}
		if _, err := o.tls.dialOption(); err != nil {
			return nil, err
		}
		return &Client{timeout: o.timeout, staleAfter: o.staleAfter, maxAttempts: o.maxAttempts, now: time.Now,
			cells: &cellSet{src: o.cells, opts: opts, conns: map[string]*Client{}}}, nil
	}
	if err := checkTarget(target); err != nil {
		return nil, err
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(serviceConfig(o.maxAttempts)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout, PermitWithoutStream: true}),
	}
	creds, err := o.tls.dialOption()
	if err != nil {
		return nil, err
	}
	if creds != nil {
		dial = append(dial, creds)
	}
	dial = append(dial, o.dialOpts...)
	if !strings.Contains(target, "://") && strings.Contains(target, ",") {
		var addrs []resolver.Address
		hosts := map[string]bool{}
		for _, a := range strings.Split(target, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, resolver.Address{Addr: a})
				host, _, _ := net.SplitHostPort(a) // checkTarget checked the form
				hosts[host] = true
			}
		}
		// The channel's authority is what TLS checks the certificate
		// against when WithTLSServerName is not given: the list's one
		// host; for hosts that differ there is no default.
		authority := "indexd"
		if o.tls.on && o.tls.serverName == "" {
			if len(hosts) != 1 {
				return nil, fmt.Errorf("%w: target %q lists different hosts; with TLS give WithTLSServerName (the name on indexd's certificate)", ErrInvalidArgument, target)
			}
			for h := range hosts {
				authority = h
			}
		}
		r := manual.NewBuilderWithScheme(fmt.Sprintf("kvindex-static-%d", staticSeq.Add(1)))
		r.InitialState(resolver.State{Addresses: addrs})
		dial = append(dial, grpc.WithResolvers(r))
		target = r.Scheme() + ":///" + authority
	} else if !strings.Contains(target, "://") {
		target = "dns:///" + target
	}
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("%w: target %q: %v", ErrInvalidArgument, target, err)
	}
	return &Client{conn: conn, api: kvindexv1.NewIndexServiceClient(conn), timeout: o.timeout, dnsHost: dnsHost(target),
		staleAfter: o.staleAfter, maxAttempts: o.maxAttempts, now: time.Now}, nil
}

// checkTarget refuses the targets New cannot mean (target.Check),
// wrapping ErrInvalidArgument.
func checkTarget(t string) error {
	if err := target.Check(t); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}

// dnsHost returns the host a "dns://[authority]/host[:port]" target
// names, or "" for any other target.
func dnsHost(target string) string {
	rest, ok := strings.CutPrefix(target, "dns://")
	if !ok {
		return ""
	}
	_, hostPort, ok := strings.Cut(rest, "/")
	if !ok {
		return ""
	}
	if host, _, err := net.SplitHostPort(hostPort); err == nil {
		return host
	}
	return hostPort
}

// noAddresses is how gRPC's base balancer (under balancerName) fails a
// call when the resolver gave it no address; the resolver's own error is
// not kept.
const noAddresses = "produced zero addresses"

// explain turns gRPC's bare "produced zero addresses" (a dns target that
// resolved to no address) into a message that says so, with the
// resolver's error, looked up again for the purpose (for at most a
// second, within ctx); and a call Close cut off (CANCELED while ctx is
// live) into one wrapping ErrClosed.
func (c *Client) explain(ctx context.Context, err error) error {
	var e *Error
	if errors.As(err, &e) && e.Code == codes.Canceled && ctx.Err() == nil && c.closed.Load() {
		// gRPC cancels the calls in flight when Close closes their
		// connection: to the caller, whose context is live, the Client
		// was closed.
		e.sentinel = ErrClosed
		return e
	}
	if c.dnsHost == "" || !errors.As(err, &e) || e.Code != codes.Unavailable || !strings.Contains(e.Message, noAddresses) || ctx.Err() != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	why := "it resolved to no address"
	if _, rerr := net.DefaultResolver.LookupHost(ctx, c.dnsHost); rerr != nil {
		why = rerr.Error()
	}
	e.Message = fmt.Sprintf("no indexd address for host %q: %s (gRPC: %s)", c.dnsHost, why, e.Message)
	return e
}

// serviceConfig balances round-robin (balancerName: passing over the
// replicas the client avoids) and retries UNAVAILABLE only.
func serviceConfig(attempts int) string {
	if attempts < 2 {
		return `{"loadBalancingConfig":[{"` + balancerName + `":{}}]}`
	}
	return fmt.Sprintf(`{
  "loadBalancingConfig": [{"%s": {}}],
  "methodConfig": [{
    "name": [{"service": "kvindex.v1.IndexService"}],
    "retryPolicy": {
      "maxAttempts": %d,
      "initialBackoff": "0.01s",
      "maxBackoff": "0.2s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`, balancerName, attempts)
}

// Close releases the connections. Calls after Close, and those in flight
// when it is called (their contexts still live), fail with ErrClosed.
func (c *Client) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	if c.cells != nil {
		return c.cells.close()
	}
	return c.conn.Close()
}

// LookupOption adjusts one Lookup.
type LookupOption func(*kvindexv1.LookupRequest)

// WithCandidates limits the answer to these endpoints (for example the
// pods this request may go to). Without it every endpoint is considered.
func WithCandidates(eps ...Endpoint) LookupOption {
	return func(r *kvindexv1.LookupRequest) {
		for _, e := range eps {
			r.Candidates = append(r.Candidates, &kvindexv1.Endpoint{Pod: e.Pod, DpRank: e.DPRank})
		}
	}
}

// WithBarrier makes the answer reflect the named produced records
// (read-your-events): the replica waits until each record's partition has
// been applied past its offset, for up to timeout (zero: the server's
// default), and otherwise fails with ErrDeadlineExceeded naming the
// lagging partition. The call's deadline bounds the wait too: the client's
// per-call deadline (WithTimeout) is extended by the barrier's timeout
// (by the server's default, 5 s, when timeout is zero), so a barrier is
// not cut short by the deadline meant for the answer itself.
func WithBarrier(timeout time.Duration, records ...PartitionOffset) LookupOption {
	return func(r *kvindexv1.LookupRequest) {
		b := &kvindexv1.Barrier{}
		if timeout > 0 {
			b.Timeout = durationpb.New(timeout)
		}
		for _, rec := range records {
			b.Records = append(b.Records, &kvindexv1.PartitionOffset{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset})
		}
		r.Barrier = b
	}
}

// Lookup asks which endpoints hold the leading blocks of a prompt of model
// whose block hashes are hashes (first block first): the endpoints' own
// keys, TokenKeys at their block size for endpoints in token mode, or
// Hasher's for vLLM engines in engine-hash mode. It errors with the
// sentinels of errors.go.
func (c *Client) Lookup(ctx context.Context, model string, hashes []uint64, opts ...LookupOption) (*LookupResult, error) {
	return c.lookup(ctx, &kvindexv1.LookupRequest{Model: model, BlockHashes: hashes}, opts)
}

// LookupTokens asks which endpoints in token mode hold the leading blocks
// of prompt p of model: the replica keys p (TokenKeys, docs/hashing.md)
// once per distinct block size among the candidate endpoints in token mode
// and matches each endpoint at its own size (Match.BlockSize). Endpoints
// in engine-hash mode are not considered. Besides the sentinels of
// errors.go it errors with ErrInvalidArgument, before sending, for a
// LoRA name, salt or item hash that is not valid UTF-8 or an item offset
// or length outside [0, 2^32); the server refuses prompts over its limits
// (docs/limits.md) and multimodal items out of prompt order, also with
// ErrInvalidArgument. Past 4 block sizes among the candidates the server
// keys the 4 whose endpoints hold the most blocks and leaves the other
// endpoints out of the answer.
func (c *Client) LookupTokens(ctx context.Context, model string, p TokenPrompt, opts ...LookupOption) (*LookupResult, error) {
	tp := &kvindexv1.TokenPrompt{TokenIds: p.TokenIDs, LoraName: p.LoRAName, CacheSalt: p.CacheSalt}
	if !utf8.ValidString(p.LoRAName) {
		return nil, invalidArgument("Lookup", "LoRA name %q is not valid UTF-8", p.LoRAName)
	}
	if !utf8.ValidString(p.CacheSalt) {
		return nil, invalidArgument("Lookup", "cache salt %q is not valid UTF-8", p.CacheSalt)
	}
	if n := len(p.MultiModal); n > 0 {
		items := make([]kvindexv1.MultiModalItem, n)
		tp.MultimodalItems = make([]*kvindexv1.MultiModalItem, n)
		for i, it := range p.MultiModal {
			if !utf8.ValidString(it.Hash) {
				return nil, invalidArgument("Lookup", "multimodal item %d: hash %q is not valid UTF-8", i, it.Hash)
			}
			if it.Offset < 0 || it.Length < 0 || uint64(it.Offset) > math.MaxUint32 || uint64(it.Length) > math.MaxUint32 {
				return nil, invalidArgument("Lookup", "multimodal item %d: offset %d or length %d is out of range [0, %d]", i, it.Offset, it.Length, uint32(math.MaxUint32))
			}
			items[i].Hash, items[i].Offset, items[i].Length = it.Hash, uint32(it.Offset), uint32(it.Length)
			tp.MultimodalItems[i] = &items[i]
		}
	}
	return c.lookup(ctx, &kvindexv1.LookupRequest{Model: model, Tokens: tp}, opts)
}

// lookup sends req with opts applied and converts the answer.
func (c *Client) lookup(ctx context.Context, req *kvindexv1.LookupRequest, opts []LookupOption) (*LookupResult, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	for _, o := range opts {
		o(req)
	}
	if err := encodable(req); err != nil {
		return nil, err
	}
	if c.cells != nil {
		return c.cells.lookup(ctx, req)
	}
	return c.send(ctx, req)
}

// send sends a complete Lookup request to this client's replicas and
// converts the answer.
func (c *Client) send(ctx context.Context, req *kvindexv1.LookupRequest) (*LookupResult, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	timeout := c.timeout
	if b := req.Barrier; b != nil {
		wait := defaultBarrierWait
		if b.Timeout != nil {
			wait = b.Timeout.AsDuration()
		}
		// Saturate: a huge barrier timeout must not wrap the deadline
		// into the past (indexd refuses a negative one).
		if wait > 0 {
			timeout = min(timeout, math.MaxInt64-wait) + wait
		}
	}
	ctx, cancel, own := deadline(ctx, timeout)
	defer cancel()
	resp, err := c.lookupFresh(ctx, req, own)
	if err != nil {
		return nil, c.explain(ctx, callError("Lookup", err))
	}
	out := &LookupResult{Revision: resp.Revision, Matches: make([]Match, len(resp.Matches))}
	if resp.ProgressTime != nil {
		out.ProgressTime = resp.ProgressTime.AsTime()
	}
	total := 0
	for _, m := range resp.Matches {
		total += len(m.Tiers)
	}
	tiers := make([]Tier, total)
	for i, m := range resp.Matches {
		ts := tiers[:len(m.Tiers):len(m.Tiers)]
		tiers = tiers[len(m.Tiers):]
		for j, t := range m.Tiers {
			ts[j] = Tier(t)
		}
		out.Matches[i] = Match{Endpoint: Endpoint{Pod: m.GetEndpoint().GetPod(), DPRank: m.GetEndpoint().GetDpRank()}, Blocks: int(m.MatchedBlocks), Tiers: ts, BlockSize: int(m.BlockSize)}
	}
	for _, o := range resp.AppliedOffsets {
		out.AppliedOffsets = append(out.AppliedOffsets, PartitionOffset{Topic: o.Topic, Partition: o.Partition, Offset: o.Offset})
	}
	return out, nil
}

// ListEndpoints lists every endpoint the index knows, of model only when
// model is non-empty, walking ListEndpointsPage pages of the server's
// default size until the last; each page is one call with its own
// per-call deadline (WithTimeout), and ctx bounds the whole walk. See
// EndpointList for what a list of several pages reflects. It is an
// operator view; routers use Lookup.
func (c *Client) ListEndpoints(ctx context.Context, model string) (*EndpointList, error) {
	if c.cells != nil {
		if c.closed.Load() {
			return nil, ErrClosed
		}
		return c.cells.listEndpoints(ctx, model)
	}
	out := &EndpointList{}
	token := ""
	// Tokens name the last endpoint of a page, so a walk never meets one
	// twice; a server that repeats one (a bug, or replicas of different
	// versions) would otherwise be followed round for ever.
	seen := map[string]bool{"": true}
	for {
		page, err := c.ListEndpointsPage(ctx, model, 0, token)
		if err != nil {
			return nil, err
		}
		out.Pages++
		out.Endpoints = append(out.Endpoints, page.Endpoints...)
		if out.Pages == 1 || page.Revision < out.Revision {
			out.Revision = page.Revision
		}
		out.MaxRevision = max(out.MaxRevision, page.Revision)
		if page.NextPageToken == "" {
			return out, nil
		}
		if seen[page.NextPageToken] {
			return nil, &Error{Method: "ListEndpoints", Code: codes.Internal, Message: fmt.Sprintf("the server returned page token %q a second time (after %d pages); the walk would not end", page.NextPageToken, out.Pages), sentinel: ErrInternal}
		}
		seen[page.NextPageToken] = true
		token = page.NextPageToken
	}
}

// ListEndpointsPage returns one page of the endpoints the index knows (of
// model only when model is non-empty): at most pageSize endpoints (0: the
// server's default, 500 unless configured; the server lowers a size above
// its maximum), after the endpoint pageToken names ("" starts at the
// first). Pass the page's NextPageToken to get the next page, with the
// same model; it is empty after the last. A page may hold fewer endpoints
// than asked even when more follow. Tokens do not expire and work on any
// replica. It errors with ErrInvalidArgument for a negative or too large
// pageSize, a model that is not valid UTF-8 or a token the server did not
// issue, and otherwise with the sentinels of errors.go.
func (c *Client) ListEndpointsPage(ctx context.Context, model string, pageSize int, pageToken string) (*EndpointPage, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	switch {
	case pageSize < 0 || pageSize > math.MaxInt32:
		return nil, invalidArgument("ListEndpoints", "page size %d is out of range [0, %d]", pageSize, math.MaxInt32)
	case !utf8.ValidString(model):
		return nil, invalidArgument("ListEndpoints", "model %q is not valid UTF-8", model)
	case !utf8.ValidString(pageToken):
		return nil, invalidArgument("ListEndpoints", "page token %q is not valid UTF-8 (not one the server issued)", pageToken)
	}
	if c.cells != nil {
		return c.cells.listEndpointsPage(ctx, model, pageSize, pageToken)
	}
	ctx, cancel, own := deadline(ctx, c.timeout)
	defer cancel()
	var resp *kvindexv1.ListEndpointsResponse
	_, _, err := c.call(ctx, own, false, func(ctx context.Context) (err error) {
		resp, err = c.api.ListEndpoints(ctx, &kvindexv1.ListEndpointsRequest{Model: model, PageSize: int32(pageSize), PageToken: pageToken})
		return err
	})
	if err != nil {
		return nil, c.explain(ctx, callError("ListEndpoints", err))
	}
	out := &EndpointPage{Revision: resp.Revision, NextPageToken: resp.NextPageToken, Endpoints: make([]EndpointInfo, len(resp.Endpoints))}
	for i, e := range resp.Endpoints {
		info := EndpointInfo{
			Model:     e.Model,
			Endpoint:  Endpoint{Pod: e.GetEndpoint().GetPod(), DPRank: e.GetEndpoint().GetDpRank()},
			GPUBlocks: e.GpuBlocks, CPUBlocks: e.CpuBlocks, DiskBlocks: e.DiskBlocks,
			BlockSize: e.BlockSize, Partition: e.Partition, HashMode: HashMode(e.HashMode),
		}
		if e.LastSeen != nil {
			info.LastSeen = e.LastSeen.AsTime()
		}
		out.Endpoints[i] = info
	}
	return out, nil
}

// encodable refuses, with ErrInvalidArgument, a Lookup request protobuf
// cannot encode: every string must be valid UTF-8 (proto3), and gRPC
// would otherwise fail the call with INTERNAL "error while marshaling".
func encodable(req *kvindexv1.LookupRequest) error {
	if !utf8.ValidString(req.Model) {
		return invalidArgument("Lookup", "model %q is not valid UTF-8", req.Model)
	}
	for i, c := range req.Candidates {
		if !utf8.ValidString(c.Pod) {
			return invalidArgument("Lookup", "candidate %d: pod %q is not valid UTF-8", i, c.Pod)
		}
	}
	for i, r := range req.GetBarrier().GetRecords() {
		if !utf8.ValidString(r.Topic) {
			return invalidArgument("Lookup", "barrier record %d: topic %q is not valid UTF-8", i, r.Topic)
		}
	}
	return nil
}

// deadline bounds ctx by timeout unless it already ends sooner; own
// reports that the call has at least half of timeout, so that running it
// out says the replica did not answer, not that the caller was in a
// hurry. (A caller whose own deadline equals the client's, as the GIE
// plugin's lookupTimeout does, is a hair sooner by the time it gets
// here: it counts as the client's.)
func deadline(ctx context.Context, timeout time.Duration) (_ context.Context, _ context.CancelFunc, own bool) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= timeout {
		return ctx, func() {}, time.Until(d) >= timeout/2
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return ctx, cancel, true
}

// defaultBarrierWait is indexd's default barrier timeout
// (indexd.DefaultBarrierTimeout), which a barrier without a timeout of its
// own waits for.
const defaultBarrierWait = 5 * time.Second
