package bridge

import "errors"

// Sentinel errors; wrapped with detail, test them with errors.Is.
var (
	// ErrInvalidConfig reports a Config that Validate rejects.
	ErrInvalidConfig = errors.New("bridge: invalid config")
	// ErrAlreadyRun reports a second call of Run on one Bridge.
	ErrAlreadyRun = errors.New("bridge: Run called twice")
	// ErrProduce reports a record Kafka refused for good (not a retried
	// outage: franz-go retries those while the bridge lives). Run returns
	// it; a restarted bridge replays what the engine still buffers.
	ErrProduce = errors.New("bridge: produce failed")
	// ErrNotReady is what Ready returns while the engine's PUB socket is
	// not connected or the bridge is still catching up after connecting.
	ErrNotReady = errors.New("bridge: not ready")
)

// Internal sentinels: they never leave the bridge (Run resyncs or
// reconnects and counts them), so they are not exported.
var (
	// errMessageTooLarge reports a ZMQ message from the engine larger than
	// Config.MaxMessageBytes; the connection carrying it is dropped.
	errMessageTooLarge = errors.New("bridge: ZMQ message too large")
	// errReplay reports a replay request that failed (dial, timeout,
	// malformed answer) or could not make progress; it is logged and
	// followed by a resync.
	errReplay = errors.New("bridge: replay failed")
)
