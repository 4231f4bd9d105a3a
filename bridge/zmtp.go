package bridge

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// The bridge speaks ZMTP through zmq4's connection layer (zmq4.Open on a
// net.Conn it dials and owns) rather than zmq4's Socket types. With zmq4
// v0.17 the Socket types leak goroutines the caller cannot stop: a PUB's
// writer goroutine is never told to exit by Close, a reader goroutine
// blocks on an unguarded send to a 10-message channel once the
// application stops receiving, Dial retries sleep without a context, and
// automatic reconnection redials from inside the reader goroutine. Owning
// the net.Conn gives each connection exactly one reading goroutine (the
// bridge's), reads that a context can interrupt (by closing the conn),
// reconnection and backoff under the bridge's control, and a bound on
// message size before anything is allocated (frameLimiter).

// endSeq is the replay end marker's sequence number: -1 as a signed 8-byte
// big-endian integer (vLLM's END_SEQ).
const endSeq = ^uint64(0)

// ZMTP frame flags (ZMTP 3.x, RFC 23).
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
	// greetingLen is the fixed ZMTP 3.x greeting both peers send first.
	greetingLen = 64
)

// zconn is one ZMTP connection the bridge dialed.
type zconn struct {
	raw net.Conn
	zc  *zmq4.Conn
}

func (c *zconn) close() { c.raw.Close() }

// recv returns the next application message, skipping ZMTP commands
// (zmq4 answers PINGs itself). A panic of zmq4's reader is an error.
func (c *zconn) recv() (zmq4.Msg, error) {
	for {
		m, err := c.recvMsg()
		if err != nil {
			return m, err
		}
		if m.Type != zmq4.CmdMsg {
			return m, nil
		}
	}
}

// recvMsg is zmq4's RecvMsg with a panic turned into an error
// (errZMTPPanic).
func (c *zconn) recvMsg() (m zmq4.Msg, err error) {
	defer recoverZMTP(&err, "reading a message")
	return c.zc.RecvMsg()
}

// send is zmq4's SendMsg with a panic turned into an error
// (errZMTPPanic).
func (c *zconn) send(m zmq4.Msg) (err error) {
	defer recoverZMTP(&err, "sending a message")
	return c.zc.SendMsg(m)
}

// errZMTPPanic reports bytes from a peer that made zmq4 panic: zmq4
// v0.17's metadata parser (Property.Write) slices past the end of a
// READY command whose metadata is cut short, so one malformed handshake
// from an engine's socket, or from anyone who reaches the bind mode's
// port, would crash the process. The bridge drops such a connection like
// any other ZMTP failure.
var errZMTPPanic = errors.New("bridge: malformed ZMTP from the peer (zmq4 panicked)")

// recoverZMTP, deferred around one zmq4 call, turns its panic into *err
// wrapping errZMTPPanic. zmq4 keeps no state of its own across a call
// (the connection, which the caller then closes, is all of it), so
// nothing is left inconsistent. Only zmq4 calls are wrapped, so a bug of
// the bridge's own still crashes.
func recoverZMTP(err *error, what string) {
	if p := recover(); p != nil {
		*err = fmt.Errorf("%w: %s: %v", errZMTPPanic, what, p)
	}
}

// openConn is zmq4.Open (greeting and NULL handshake) with a panic turned
// into an error (errZMTPPanic).
func openConn(rw net.Conn, typ zmq4.SocketType, server bool) (zc *zmq4.Conn, err error) {
	defer recoverZMTP(&err, "handshake")
	return zmq4.Open(rw, null.Security(), typ, nil, server, nil)
}

// dialZMTP dials addr and performs the ZMTP greeting and NULL handshake as
// a socket of type typ, within timeout; ctx interrupts both. Every byte
// read afterwards passes a frameLimiter of maxMessage bytes.
func dialZMTP(ctx context.Context, addr string, typ zmq4.SocketType, timeout time.Duration, maxMessage int64) (*zconn, error) {
	d := net.Dialer{Timeout: timeout}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return openZMTP(ctx, raw, addr, typ, false, timeout, maxMessage)
}

// openZMTP performs the ZMTP greeting and NULL handshake on raw, which it
// owns from then on (closed on failure), as a socket of type typ, as the
// server side when server is set (an accepted connection), within
// timeout; ctx interrupts both.
func openZMTP(ctx context.Context, raw net.Conn, addr string, typ zmq4.SocketType, server bool, timeout time.Duration, maxMessage int64) (*zconn, error) {
	if err := raw.SetDeadline(time.Now().Add(timeout)); err != nil {
		raw.Close()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	zc, err := openConn(&frameLimiter{Conn: raw, max: maxMessage, skip: greetingLen}, typ, server)
	stopped := stop()
	if err == nil && !stopped {
		err = ctx.Err()
	}
	if err == nil {
		err = raw.SetDeadline(time.Time{})
	}
	if err != nil {
		raw.Close()
		return nil, fmt.Errorf("ZMTP handshake with %s as %s: %w", addr, typ, err)
	}
	return &zconn{raw: raw, zc: zc}, nil
}

// frameLimiter follows the ZMTP frame structure of the bytes read through
// it and fails the read that would deliver the length of a message (the
// sum of its frames) or of a command larger than max, before zmq4
// allocates a buffer of that length. After an error the connection is
// unusable and must be closed.
type frameLimiter struct {
	net.Conn
	max  int64
	skip int // greeting bytes still to pass
	err  error

	flags   byte
	need    int    // length bytes of the current header still to read (0: at a header)
	inLen   bool   // reading length bytes
	size    uint64 // length being assembled
	body    uint64 // body bytes of the current frame still to pass
	message int64  // bytes of the current multi-frame message so far
}

func (l *frameLimiter) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	n, err := l.Conn.Read(p)
	if serr := l.scan(p[:n]); serr != nil {
		l.err = serr
		return 0, serr
	}
	return n, err
}

func (l *frameLimiter) scan(p []byte) error {
	for len(p) > 0 {
		switch {
		case l.skip > 0:
			k := min(l.skip, len(p))
			l.skip -= k
			p = p[k:]
		case l.body > 0:
			k := min(uint64(len(p)), l.body)
			l.body -= k
			p = p[k:]
			if l.body == 0 {
				l.endFrame()
			}
		case !l.inLen:
			l.flags, l.inLen, l.size = p[0], true, 0
			l.need = 1
			if l.flags&flagLong != 0 {
				l.need = 8
			}
			p = p[1:]
		default:
			l.size = l.size<<8 | uint64(p[0])
			l.need--
			p = p[1:]
			if l.need > 0 {
				continue
			}
			l.inLen = false
			if err := l.admit(); err != nil {
				return err
			}
			l.body = l.size
			if l.body == 0 {
				l.endFrame()
			}
		}
	}
	return nil
}

// admit checks the frame whose length was just read.
func (l *frameLimiter) admit() error {
	if l.flags&flagCommand != 0 {
		if l.size > uint64(l.max) {
			return fmt.Errorf("%w: a %d-byte command, limit %d", errMessageTooLarge, l.size, l.max)
		}
		return nil
	}
	if l.size > uint64(l.max-l.message) {
		return fmt.Errorf("%w: over %d bytes, limit %d", errMessageTooLarge, uint64(l.message)+l.size, l.max)
	}
	l.message += int64(l.size)
	return nil
}

func (l *frameLimiter) endFrame() {
	if l.flags&flagCommand != 0 || l.flags&flagMore == 0 {
		l.message = 0
	}
}

// replayStream is one replay request's answer, read message by message.
type replayStream struct {
	c       *zconn
	timeout time.Duration
	stop    func() bool
	// topic, when set, is the topic an answer with a topic frame must
	// carry.
	topic []byte
}

// openReplay dials st's replay socket as a DEALER and asks for every
// buffered batch with seq >= from: [empty delimiter, from as 8 bytes
// big-endian], the framing vLLM's ROUTER expects from a REQ or DEALER
// (and llm-d-inference-sim's).
func (b *Bridge) openReplay(ctx context.Context, st *stream, from uint64) (*replayStream, error) {
	c, err := dialZMTP(ctx, st.replayAddr, zmq4.Dealer, b.cfg.DialTimeout, int64(b.cfg.MaxMessageBytes))
	if err != nil {
		return nil, err
	}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], from)
	if err := c.send(zmq4.NewMsgFrom([]byte{}, seq[:])); err != nil {
		c.close()
		return nil, fmt.Errorf("sending replay request: %w", err)
	}
	return &replayStream{c: c, timeout: b.cfg.ReplayTimeout, stop: context.AfterFunc(ctx, c.close), topic: st.replayTopic}, nil
}

// next returns the next batch of the answer, or end at the end marker.
//
// Two framings are read: [empty, seq, payload] (vLLM at 0181ea31) and
// [empty, topic, seq, payload] (llm-d-inference-sim, newer vLLM copies of
// kv_events.py, and what llm-d-router v0.10.0 expects); the end marker is
// either [empty, -1, empty] or [empty, empty, -1, empty]. The framing is
// told apart by frame count, so each message may use either. With r.topic
// set, a non-empty topic frame other than r.topic is refused: the answer
// is another endpoint's.
func (r *replayStream) next() (seq uint64, payload []byte, end bool, err error) {
	if err := r.c.raw.SetReadDeadline(time.Now().Add(r.timeout)); err != nil {
		return 0, nil, false, err
	}
	m, err := r.c.recv()
	if err != nil {
		return 0, nil, false, err
	}
	seq, payload, err = replayFrames(m.Frames, r.topic)
	if err != nil {
		return 0, nil, false, err
	}
	return seq, payload, seq == endSeq, nil
}

// replayFrames reads one replay answer message (see replayStream.next).
func replayFrames(f [][]byte, topic []byte) (uint64, []byte, error) {
	switch {
	case len(f) == 3 && len(f[0]) == 0 && len(f[1]) == 8:
		return binary.BigEndian.Uint64(f[1]), f[2], nil
	case len(f) == 4 && len(f[0]) == 0 && len(f[2]) == 8:
		seq := binary.BigEndian.Uint64(f[2])
		if topic != nil && len(f[1]) > 0 && seq != endSeq && string(f[1]) != string(topic) {
			return 0, nil, fmt.Errorf("replay answer for topic %q, want %q", f[1], topic)
		}
		return seq, f[3], nil
	}
	return 0, nil, fmt.Errorf("replay answer has %d frames (want [empty, seq(8), payload] or [empty, topic, seq(8), payload])", len(f))
}

func (r *replayStream) close() {
	r.stop()
	r.c.close()
}

// probe reports whether the engine still answers: a TCP connection and a
// ZMTP handshake with its replay socket, or, when that fails or there is
// none, with its PUB socket, within the probe interval. Only when neither
// answers is the engine gone: a replay endpoint that was never right must
// not turn a sidecar restart into a goodbye.
func (b *Bridge) probe(ctx context.Context) error {
	var errs []error
	if b.one.replayAddr != "" {
		c, err := dialZMTP(ctx, b.one.replayAddr, zmq4.Dealer, b.cfg.ProbeInterval, int64(b.cfg.MaxMessageBytes))
		if err == nil {
			c.close()
			return nil
		}
		errs = append(errs, err)
	}
	c, err := dialZMTP(ctx, b.addr, zmq4.Sub, b.cfg.ProbeInterval, int64(b.cfg.MaxMessageBytes))
	if err == nil {
		c.close()
		return nil
	}
	return errors.Join(append(errs, err)...)
}
