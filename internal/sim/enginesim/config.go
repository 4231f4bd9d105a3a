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
	// replay_endpoint=None).
	ReplayAddr string
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
	if _, _, err := net.SplitHostPort(c.PubAddr); err != nil {
		return fmt.Errorf("%w: PubAddr %q: %v", ErrInvalidConfig, c.PubAddr, err)
	}
	if c.ReplayAddr != "" {
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
