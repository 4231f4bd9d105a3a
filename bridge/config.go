package bridge

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/internal/keyspace"
)

// Config configures a Bridge. Start from DefaultConfig and set Brokers,
// Topic and either (dial mode, a sidecar per endpoint) Endpoint, Pod and
// Model, or (bind mode, one bridge for a fleet) Listen.
type Config struct {
	// Endpoint is the engine's ZMQ PUB socket, "tcp://HOST:PORT", dialed
	// as given (see OffsetEndpointPort for vLLM's data-parallel port
	// offset). Dial mode: required; HOST must name a host ("*" is a bind
	// address). Must be empty with Listen.
	Endpoint string
	// Listen selects the bind mode: the endpoint "tcp://HOST:PORT" the
	// bridge binds and engines' PUB sockets connect to, as llm-d's pods
	// connect to llm-d's subscriber (HOST "*" is every interface, PORT 0
	// a free one, see Bridge.Addr). Each message's topic names its
	// endpoint (TopicPattern). Default "": the dial mode.
	Listen string
	// TopicPattern (bind mode) is how a topic names its endpoint: literal
	// text with the placeholders {pod} (required) and {model}, which take
	// the shortest text up to the next literal (the last one takes the
	// rest). The text before the first placeholder is the ZMQ
	// subscription. Default DefaultTopicPattern, llm-d's
	// "kv@{pod}@{model}". Without {model}, Model names every pod's model.
	TopicPattern string
	// ReplayPattern (bind mode) is each pod's replay endpoint, made from
	// its topic: "tcp://{host}:5558" with {pod}, {host} (the pod without a
	// trailing ":port") and {model}. Default "": no replay, so a pod's
	// gaps and reconnects produce a resync of that pod.
	ReplayPattern string
	// MaxPods (bind mode) bounds the pods (distinct topics) the bridge
	// keeps a stream for; messages of further topics are skipped and
	// counted (kvindex_bridge_unknown_topics_total{reason=too_many_pods}).
	// Default 1,024; must be at least 1.
	MaxPods int
	// MaxConnections (bind mode) bounds the open publisher connections;
	// further ones are closed at once and counted. Default 2,048; must be
	// at least 1.
	MaxConnections int
	// PodQueueSize (bind mode) is the capacity of each pod's channel from
	// its connection to its sequencer. Default 64; must be at least 1.
	// Memory is bounded by MaxPods × PodQueueSize + QueueSize messages
	// (each at most MaxMessageBytes) plus MaxBufferedBytes.
	PodQueueSize int
	// PodIdleTimeout (bind mode) is how long a pod with no connection is
	// kept: after it, its stream is forgotten, as if a fresh bridge had
	// never seen it. Default 10 min; must be positive.
	PodIdleTimeout time.Duration
	// ReplayEndpoint is the engine's ROUTER replay socket,
	// "tcp://HOST:PORT". Default "": none, so gaps and reconnects cannot be
	// healed and produce a resync instead.
	ReplayEndpoint string
	// ZMQTopic is the subscription prefix. Default "" (every topic; vLLM's
	// default topic is "").
	ZMQTopic string

	// Pod is the record key: the pod identity routers use for the endpoint.
	// Dial mode: required, non-empty UTF-8, at most 512 bytes. Bind mode:
	// unused (the topic names each pod).
	Pod string
	// Model is the served model name (header "model"). Dial mode:
	// required, same rules as Pod. Bind mode: the model of pods whose
	// topic names none (a TopicPattern without {model}); else unused.
	Model string
	// DPRank is the endpoint's data-parallel rank (header "dp_rank").
	// Default 0. Dial mode only: in the bind mode a pod's rank is the
	// data_parallel_rank of its first batch.
	DPRank uint32

	// Brokers are the Kafka seed brokers, host:port. Required: at least
	// one, and no entry empty.
	Brokers []string
	// Topic is the Kafka topic. Required unless Cells is set (then
	// unused); the CLI defaults it to kvindex-events.
	Topic string
	// Cells routes each record by the cell map (docs/DESIGN.md "Cells"):
	// to the topic, and the brokers if the cell has its own (else
	// Brokers), of the cell that writes the record's model and pod. A
	// *cellmap.Watcher follows map changes (its Run is the caller's); see
	// Bridge for what a change does. Default nil: Topic. In the dial mode
	// the map must have a cell for Model.
	Cells CellSource
	// MaxBufferedRecords bounds the records the Kafka client holds
	// unacknowledged; a full buffer blocks the bridge (backpressure) until
	// Kafka acknowledges. Default 10,000; must be at least 1.
	MaxBufferedRecords int
	// MaxBufferedBytes bounds the bytes the Kafka client holds
	// unacknowledged, like MaxBufferedRecords. Default 64 MiB (a sidecar's
	// memory limit is small); must be at least MaxRecordBytes.
	MaxBufferedBytes int
	// MaxRecordBytes is the largest batch payload produced; a larger batch
	// is skipped, counted, logged and followed by a resync record, since
	// the ingester must not assume continuity across it. The producer's
	// batch limit is MaxRecordBytes + 2 KiB (key, headers, framing), which
	// the topic's max.message.bytes must allow. Default 1,000,000 (Kafka's
	// default max.message.bytes is 1,048,588); 1 to 512 MiB.
	MaxRecordBytes int
	// KafkaOptions are extra franz-go client options (TLS, SASL, tuning),
	// applied after the bridge's own. Default none. Options that change
	// acks, idempotence or the partitioner break the record contract.
	KafkaOptions []kgo.Opt

	// QueueSize is the capacity of each of the two channels inside the
	// bridge: ZMQ messages from the SUB reader to the sequencer, and
	// records from the sequencer to the producer. Default 256; must be at
	// least 1. Memory is bounded by 2 × QueueSize messages (of at most
	// MaxMessageBytes, in practice the engine's batch size) plus
	// MaxBufferedBytes.
	QueueSize int
	// MaxMessageBytes bounds one ZMQ message (all frames) read from the
	// engine; a larger one drops the connection before it is read
	// (counted, then healed or resynced like any loss). Messages between
	// MaxRecordBytes and it are read, skipped and resynced without losing
	// the connection. Default 16 MiB; must be at least MaxRecordBytes and
	// at most 1 GiB (maxMessageBytesLimit): zmq4 allocates each frame at
	// the length its header claims before reading it, so the limit is
	// what one frame header from the engine (or, in the bind mode, from
	// anyone reaching the port) makes the process allocate; without a
	// bound, a header claiming 2^61 bytes made make() panic. 1 GiB is
	// twice the largest MaxRecordBytes (512 MiB), room enough to read and
	// skip a batch over it without dropping the connection; a larger
	// message could never be produced anyway.
	MaxMessageBytes int

	// HeartbeatInterval is the period of kind=heartbeat records while the
	// engine's PUB socket is connected. Default 5 s; must be positive and
	// well below the ingester's --liveness-window.
	HeartbeatInterval time.Duration
	// GracePeriod is how long Run watches the engine after its context
	// ends: if the engine goes away within it, Run produces kind=goodbye;
	// if it is still there, this is a sidecar-only restart and Run exits
	// without one. Default 10 s; 0 skips watching (never a goodbye).
	GracePeriod time.Duration
	// ProbeInterval is the period of engine probes during GracePeriod, and
	// each probe's timeout. Default 500 ms; must be positive.
	ProbeInterval time.Duration
	// ProbeFailures is how many consecutive failed probes mean the engine
	// is gone. Default 2; must be at least 1.
	ProbeFailures int
	// FlushTimeout bounds each flush of the Kafka client on shutdown (the
	// batches already received, then the goodbye). Records still unsent
	// after it are counted as lost. Default 5 s; must be positive.
	FlushTimeout time.Duration
	// DialTimeout bounds a TCP dial plus ZMTP handshake with the engine.
	// Default 5 s; must be positive.
	DialTimeout time.Duration
	// ReplayTimeout is how long to wait for each message of a replay
	// answer, and for a new batch in it: an answer that only repeats
	// batches already produced fails too once this passes. Default 5 s;
	// must be positive.
	ReplayTimeout time.Duration
	// ReplayAttempts is how many replay requests in a row may make no
	// progress before the bridge gives up healing and produces a resync.
	// Default 3; must be at least 1.
	ReplayAttempts int
	// ReconnectBackoff is the first wait before redialing the engine (and
	// between replay attempts); it doubles up to MaxReconnectBackoff.
	// Default 100 ms; must be positive.
	ReconnectBackoff time.Duration
	// MaxReconnectBackoff caps ReconnectBackoff's doubling. Default 5 s;
	// must be at least ReconnectBackoff.
	MaxReconnectBackoff time.Duration
	// ReplayBackoff is how long, after a heal of a live gap failed (the
	// replay socket gave no usable answer in ReplayAttempts tries), later
	// live gaps are resynced at once without asking it (resync reason
	// replay_backoff): a replay socket that accepts and never answers
	// would otherwise hold the stream ReplayAttempts × ReplayTimeout per
	// gap, long enough for the engine's PUB queue to overflow into the
	// next gap. It doubles with each failed heal in a row up to
	// MaxReplayBackoff; a replay that succeeds ends it (a new connection
	// always asks). Default 10 s; must be positive.
	ReplayBackoff time.Duration
	// MaxReplayBackoff caps ReplayBackoff's doubling. Default 5 min; must
	// be at least ReplayBackoff.
	MaxReplayBackoff time.Duration

	// Logger receives the bridge's logs; nil discards them.
	Logger *slog.Logger
	// Registry receives the bridge's metrics (kvindex_bridge_*). Nil means
	// they are kept but registered nowhere.
	Registry prometheus.Registerer
	// Clock drives heartbeats, the grace period, probes and backoffs. Nil
	// means the real clock (tests inject a fake one).
	Clock clockwork.Clock
}

// maxRecordBytesLimit bounds MaxRecordBytes, keeping the producer's batch
// limit well inside franz-go's 1 GiB.
const maxRecordBytesLimit = 512 << 20

// maxMessageBytesLimit bounds MaxMessageBytes (see there): twice
// maxRecordBytesLimit.
const maxMessageBytesLimit = 2 * maxRecordBytesLimit

// recordOverhead is what a record adds to its payload in a Kafka batch at
// most: a key and model of up to 512 bytes each, the other headers and the
// record and batch framing.
const recordOverhead = 2 << 10

// DefaultConfig returns the defaults documented on Config's fields; the
// required fields are left empty.
func DefaultConfig() Config {
	return Config{
		MaxBufferedRecords:  10000,
		MaxBufferedBytes:    64 << 20,
		MaxRecordBytes:      1000000,
		QueueSize:           256,
		MaxMessageBytes:     16 << 20,
		HeartbeatInterval:   5 * time.Second,
		GracePeriod:         10 * time.Second,
		ProbeInterval:       500 * time.Millisecond,
		ProbeFailures:       2,
		FlushTimeout:        5 * time.Second,
		DialTimeout:         5 * time.Second,
		ReplayTimeout:       5 * time.Second,
		ReplayAttempts:      3,
		ReconnectBackoff:    100 * time.Millisecond,
		MaxReconnectBackoff: 5 * time.Second,
		ReplayBackoff:       10 * time.Second,
		MaxReplayBackoff:    5 * time.Minute,
		TopicPattern:        DefaultTopicPattern,
		MaxPods:             1024,
		MaxConnections:      2048,
		PodQueueSize:        64,
		PodIdleTimeout:      10 * time.Minute,
	}
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if c.Listen != "" {
		if err := c.validateBind(); err != nil {
			return bad("%v", err)
		}
	} else {
		if _, err := dialAddr(c.Endpoint); err != nil {
			return bad("Endpoint: %v", err)
		}
		if c.ReplayEndpoint != "" {
			if _, err := dialAddr(c.ReplayEndpoint); err != nil {
				return bad("ReplayEndpoint: %v", err)
			}
		}
		if err := keyspace.ValidateName("pod", c.Pod); err != nil {
			return bad("Pod: %v", err)
		}
		if err := keyspace.ValidateName("model", c.Model); err != nil {
			return bad("Model: %v", err)
		}
	}
	if len(c.Brokers) == 0 {
		return bad("Brokers: none given")
	}
	for i, br := range c.Brokers {
		if strings.TrimSpace(br) == "" {
			return bad("Brokers: entry %d of %d is empty", i+1, len(c.Brokers))
		}
	}
	if c.Cells != nil {
		m := c.Cells.Current()
		if m == nil {
			return bad("Cells: no map")
		}
		if c.Listen == "" {
			if _, err := m.WriteCell(c.Model, c.Pod); err != nil {
				return bad("Cells: %v", err)
			}
		}
	} else if c.Topic == "" {
		return bad("Topic: empty")
	}
	for _, p := range []struct {
		name string
		v    int
	}{
		{"MaxBufferedRecords", c.MaxBufferedRecords}, {"MaxRecordBytes", c.MaxRecordBytes},
		{"QueueSize", c.QueueSize}, {"ProbeFailures", c.ProbeFailures}, {"ReplayAttempts", c.ReplayAttempts},
	} {
		if p.v < 1 {
			return bad("%s %d: want at least 1", p.name, p.v)
		}
	}
	if c.MaxRecordBytes > maxRecordBytesLimit {
		return bad("MaxRecordBytes %d: want at most %d", c.MaxRecordBytes, maxRecordBytesLimit)
	}
	if c.MaxBufferedBytes < c.MaxRecordBytes {
		return bad("MaxBufferedBytes %d: want at least MaxRecordBytes (%d)", c.MaxBufferedBytes, c.MaxRecordBytes)
	}
	if c.MaxMessageBytes < c.MaxRecordBytes {
		return bad("MaxMessageBytes %d: want at least MaxRecordBytes (%d)", c.MaxMessageBytes, c.MaxRecordBytes)
	}
	if c.MaxMessageBytes > maxMessageBytesLimit {
		return bad("MaxMessageBytes %d: want at most %d (1 GiB)", c.MaxMessageBytes, maxMessageBytesLimit)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"HeartbeatInterval", c.HeartbeatInterval}, {"ProbeInterval", c.ProbeInterval},
		{"FlushTimeout", c.FlushTimeout}, {"DialTimeout", c.DialTimeout}, {"ReplayTimeout", c.ReplayTimeout},
		{"ReconnectBackoff", c.ReconnectBackoff}, {"ReplayBackoff", c.ReplayBackoff},
	} {
		if d.v <= 0 {
			return bad("%s %v: want a positive duration", d.name, d.v)
		}
	}
	if c.GracePeriod < 0 {
		return bad("GracePeriod %v: want zero or positive", c.GracePeriod)
	}
	if c.MaxReconnectBackoff < c.ReconnectBackoff {
		return bad("MaxReconnectBackoff %v: want at least ReconnectBackoff (%v)", c.MaxReconnectBackoff, c.ReconnectBackoff)
	}
	if c.MaxReplayBackoff < c.ReplayBackoff {
		return bad("MaxReplayBackoff %v: want at least ReplayBackoff (%v)", c.MaxReplayBackoff, c.ReplayBackoff)
	}
	return nil
}

// validateBind checks the bind mode's fields.
func (c Config) validateBind() error {
	if c.Endpoint != "" || c.ReplayEndpoint != "" {
		return fmt.Errorf("Endpoint and ReplayEndpoint are the dial mode's; with Listen set, use ReplayPattern")
	}
	if _, err := listenAddr(c.Listen); err != nil {
		return fmt.Errorf("Listen: %v", err)
	}
	tp, err := parseTopicPattern(c.TopicPattern)
	if err != nil {
		return fmt.Errorf("TopicPattern: %v", err)
	}
	if !tp.hasModel() {
		if err := keyspace.ValidateName("model", c.Model); err != nil {
			return fmt.Errorf("Model (TopicPattern %q names no model): %v", c.TopicPattern, err)
		}
	}
	if _, err := parseReplayPattern(c.ReplayPattern); err != nil {
		return fmt.Errorf("ReplayPattern: %v", err)
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"MaxPods", c.MaxPods}, {"MaxConnections", c.MaxConnections}, {"PodQueueSize", c.PodQueueSize}} {
		if p.v < 1 {
			return fmt.Errorf("%s %d: want at least 1", p.name, p.v)
		}
	}
	if c.PodIdleTimeout <= 0 {
		return fmt.Errorf("PodIdleTimeout %v: want a positive duration", c.PodIdleTimeout)
	}
	return nil
}

// dialAddr turns a ZMQ endpoint the bridge dials, "tcp://HOST:PORT", into
// the host:port to dial.
func dialAddr(endpoint string) (string, error) {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("%q: want tcp://HOST:PORT", endpoint)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("%q: %v", endpoint, err)
	}
	if host == "" || host == "*" {
		return "", fmt.Errorf("%q: name the engine's host (%q is a bind address)", endpoint, host)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return "", fmt.Errorf("%q: port %q is not in 1-65535", endpoint, port)
	}
	return rest, nil
}

// OffsetEndpointPort applies vLLM's data-parallel port rule to a tcp
// endpoint: the engine of rank r binds the configured port + r (vLLM's
// ZmqEventPublisher.offset_endpoint_port), so a sidecar given the engine's
// configured endpoints and its rank dials the right sockets. An empty
// endpoint stays empty.
func OffsetEndpointPort(endpoint string, rank uint32) (string, error) {
	if endpoint == "" || rank == 0 {
		return endpoint, nil
	}
	if _, err := dialAddr(endpoint); err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	i := strings.LastIndexByte(endpoint, ':')
	port, _ := strconv.ParseUint(endpoint[i+1:], 10, 16)
	if port+uint64(rank) > 65535 {
		return "", fmt.Errorf("%w: %q offset by rank %d is past port 65535", ErrInvalidConfig, endpoint, rank)
	}
	return endpoint[:i+1] + strconv.FormatUint(port+uint64(rank), 10), nil
}
