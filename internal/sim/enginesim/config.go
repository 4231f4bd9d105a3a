package enginesim

import (
	"fmt"
	"log/slog"
	"net"
)

// Config configures an Engine.
type Config struct {
	// PubAddr is the host:port the PUB socket listens on. Default
	// "127.0.0.1:0" (a free loopback port, kept across Restart). Required.
	PubAddr string
	// ReplayAddr is the host:port of the ROUTER replay socket. Default
	// "127.0.0.1:0"; "" means the engine has no replay socket (vLLM's
	// replay_endpoint=None). Ignored when ReplayListener is set.
	ReplayAddr string
	// ReplayListener, when set, is an already-open listener the replay
	// socket serves on instead of binding ReplayAddr, so a test can bind
	// first and name the port before the engine exists (ListenSamePort).
	// The engine owns it from New on, also when New fails: Close (or a
	// Restart) closes it, and a Restart binds its address again. Default
	// nil.
	ReplayListener net.Listener
	// BufferSize is how many of the newest batches the replay buffer keeps
	// (vLLM's buffer_steps). Default 10,000; must be at least 1.
	BufferSize int
	// Topic is the first frame of every PUB message. Default "" (vLLM's
	// default topic).
	Topic string
	// HWM is how many messages may wait for one subscriber before the PUB
	// socket drops messages for it (libzmq's send high-water mark). Default
	// 1,000 (libzmq's default; vLLM raises it to 100,000); must be at
	// least 1.
	HWM int
	// Connect, when set, is the host:port the PUB socket dials instead of
	// listening on PubAddr: an llm-d pod (and llm-d-inference-sim)
	// connects to the subscriber's bound endpoint. The engine redials
	// after every lost connection until Close, as zmq4's PUB does with
	// automatic reconnection. Default "" (listen, as vLLM binds).
	Connect string
	// FirstSeq is the sequence number of the first batch of each process.
	// Default 0 (vLLM); llm-d-inference-sim starts at 1.
	FirstSeq uint64
	// ReplayTopicFrame makes replay answers carry the topic, [empty,
	// topic, seq, payload], ending with [empty, empty, -1, empty], as
	// llm-d-inference-sim sends and llm-d-router v0.10.0 expects. Default
	// false: [empty, seq, payload] (vLLM at 0181ea31).
	ReplayTopicFrame bool
	// Logger receives the engine's logs; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults documented on Config's fields.
func DefaultConfig() Config {
	return Config{
		PubAddr:    "127.0.0.1:0",
		ReplayAddr: "127.0.0.1:0",
		BufferSize: 10000,
		HWM:        1000,
	}
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	if c.Connect != "" {
		if _, _, err := net.SplitHostPort(c.Connect); err != nil {
			return fmt.Errorf("%w: Connect %q: %v", ErrInvalidConfig, c.Connect, err)
		}
	} else if _, _, err := net.SplitHostPort(c.PubAddr); err != nil {
		return fmt.Errorf("%w: PubAddr %q: %v", ErrInvalidConfig, c.PubAddr, err)
	}
	if c.ReplayAddr != "" && c.ReplayListener == nil {
		if _, _, err := net.SplitHostPort(c.ReplayAddr); err != nil {
			return fmt.Errorf("%w: ReplayAddr %q: %v", ErrInvalidConfig, c.ReplayAddr, err)
		}
	}
	if c.BufferSize < 1 {
		return fmt.Errorf("%w: BufferSize %d: want at least 1", ErrInvalidConfig, c.BufferSize)
	}
	if c.HWM < 1 {
		return fmt.Errorf("%w: HWM %d: want at least 1", ErrInvalidConfig, c.HWM)
	}
	return nil
}
