package bridge

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// frame encodes one ZMTP frame.
func frame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		var h [9]byte
		h[0] = flags | flagLong
		binary.BigEndian.PutUint64(h[1:], uint64(len(body)))
		return append(h[:], body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

// longHeader is a long frame header claiming size bytes, without a body.
func longHeader(flags byte, size uint64) []byte {
	var h [9]byte
	h[0] = flags | flagLong
	binary.BigEndian.PutUint64(h[1:], size)
	return h[:]
}

func TestFrameLimiter(t *testing.T) {
	greeting := bytes.Repeat([]byte{0x7f}, greetingLen)
	ready := frame(flagCommand, bytes.Repeat([]byte("r"), 40))
	msg := func(sizes ...int) []byte {
		var out []byte
		for i, n := range sizes {
			f := byte(flagMore)
			if i == len(sizes)-1 {
				f = 0
			}
			out = append(out, frame(f, bytes.Repeat([]byte("m"), n))...)
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		stream  []byte
		wantErr bool
	}{
		{"within_limit", cat(greeting, ready, msg(0, 8, 80), msg(100)), false},
		{"many_messages_each_within_limit", cat(greeting, ready, msg(60, 40), msg(100), msg(99, 1)), false},
		{"message_over_limit", cat(greeting, ready, msg(0, 8, 93)), true},
		{"single_frame_over_limit", cat(greeting, ready, msg(101)), true},
		{"huge_claimed_length", cat(greeting, ready, longHeader(0, 1<<62)), true},
		{"max_length_claimed", cat(greeting, ready, longHeader(flagMore, ^uint64(0))), true},
		{"command_over_limit", cat(greeting, frame(flagCommand, bytes.Repeat([]byte("c"), 101))), true},
		{"greeting_bytes_not_parsed", cat(bytes.Repeat([]byte{0xff}, greetingLen), msg(100)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Deliver the stream in every chunk size, so headers split
			// across reads are covered.
			for _, chunk := range []int{1, 2, 3, 7, 64, 1 << 16} {
				a, b := net.Pipe()
				go func() {
					for p := tc.stream; len(p) > 0; p = p[min(chunk, len(p)):] {
						if _, err := a.Write(p[:min(chunk, len(p))]); err != nil {
							break
						}
					}
					a.Close()
				}()
				l := &frameLimiter{Conn: b, max: 100, skip: greetingLen}
				_, err := io.Copy(io.Discard, l)
				b.Close()
				if gotErr := errors.Is(err, errMessageTooLarge); gotErr != tc.wantErr || (err != nil && !gotErr) {
					t.Errorf("chunk %d: read error %v, want too-large error: %v", chunk, err, tc.wantErr)
				}
			}
		})
	}
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// overLimit is the reference for frameLimiter: it parses the frames after
// the greeting one at a time and reports whether a length header that
// arrives in full declares a command, or takes a message, over max.
func overLimit(stream []byte, max uint64) bool {
	p := stream[min(greetingLen, len(stream)):]
	var message uint64
	for len(p) > 0 {
		flags := p[0]
		n := 1
		if flags&flagLong != 0 {
			n = 8
		}
		if len(p) < 1+n {
			return false // the length never arrives in full
		}
		var size uint64
		for _, c := range p[1 : 1+n] {
			size = size<<8 | uint64(c)
		}
		p = p[1+n:]
		if flags&flagCommand != 0 {
			if size > max {
				return true
			}
		} else {
			if size > max-message {
				return true
			}
			message += size
		}
		if uint64(len(p)) < size {
			return false
		}
		p = p[size:]
		if flags&flagCommand != 0 || flags&flagMore == 0 {
			message = 0
		}
	}
	return false
}

func FuzzFrameLimiter(f *testing.F) {
	greeting := bytes.Repeat([]byte{0x7f}, greetingLen)
	f.Add(cat(greeting, frame(flagCommand, []byte("READY")), frame(flagMore, nil), frame(0, []byte("abc"))), uint8(3))
	f.Add(cat(greeting, frame(flagMore, bytes.Repeat([]byte("x"), 60)), frame(0, bytes.Repeat([]byte("y"), 41))), uint8(64))
	f.Add(cat(greeting, longHeader(0, 1<<40)), uint8(1))
	f.Add([]byte{1, 2, 3}, uint8(2))
	f.Fuzz(func(t *testing.T, stream []byte, chunk uint8) {
		const max = 100
		want := overLimit(stream, max)
		a, b := net.Pipe()
		step := int(chunk%16) + 1
		go func() {
			for p := stream; len(p) > 0; p = p[min(step, len(p)):] {
				if _, err := a.Write(p[:min(step, len(p))]); err != nil {
					break
				}
			}
			a.Close()
		}()
		l := &frameLimiter{Conn: b, max: max, skip: greetingLen}
		_, err := io.Copy(io.Discard, l)
		b.Close()
		if got := errors.Is(err, errMessageTooLarge); got != want {
			t.Fatalf("limiter refused: %v (%v), reference says over the limit: %v", got, err, want)
		}
	})
}

// TestOpenZMTPRecoversZmq4Panic: zmq4 v0.17 panics (slice bounds out of
// range in Property.Write) on a READY command whose metadata names a
// 1-byte property and then ends. openZMTP, which every handshake of the
// bridge goes through (PUB, replay, probes, bind-mode accepts), returns
// that as an error wrapping errZMTPPanic and closes the connection.
// Before, the panic crashed the process.
func TestOpenZMTPRecoversZmq4Panic(t *testing.T) {
	bridgeSide, peer := net.Pipe()
	defer peer.Close()
	go io.Copy(io.Discard, peer) // net.Pipe is unbuffered: read while writing
	go func() {
		g := make([]byte, greetingLen)
		g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
		copy(g[12:32], "NULL")
		peer.Write(g)
		peer.Write(frame(flagCommand, append([]byte("\x05READY"), 0x01, 'a')))
	}()
	_, err := openZMTP(context.Background(), bridgeSide, "pipe", zmq4.Sub, false, 5*time.Second, 1<<20)
	if !errors.Is(err, errZMTPPanic) {
		t.Fatalf("openZMTP = %v, want an error wrapping errZMTPPanic", err)
	}
	if _, werr := bridgeSide.Write([]byte{0}); werr == nil {
		t.Error("the connection is still open after the failed handshake")
	}
}
