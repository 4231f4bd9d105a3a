package indexd

import (
	"context"
	"time"

	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/tap"
)

// requestRead bounds how long a call may take to deliver its request
// (Config.RequestReadTimeout): its tap (grpc.InTapHandle) starts a timer
// when a call's headers arrive and returns the context the timer cancels,
// which grpc-go gives the call's reader, so a read still waiting for the
// request's bytes ends, and with it the call and what it buffered. As a
// stats handler it stops the timer at the call's first whole message in
// (InPayload) and releases it at the call's end. (The context TagRPC
// returns would not do: grpc-go builds the reader before it calls
// TagRPC.)
type requestRead struct {
	timeout time.Duration
	// timedOut counts the calls cancelled (nil: not counted).
	timedOut func()
}

// requestWait is one call's timer, kept in its context.
type requestWait struct {
	timer  *time.Timer
	cancel context.CancelFunc
}

type requestWaitKey struct{}

// tap starts the call's timer and returns the context it cancels.
// A call that ends without reaching a handler (an unknown method, a
// deadline already past) gets no End: the stream's own context ending
// stops its timer then, so nothing of it is held or counted later.
func (h requestRead) tap(stream context.Context, _ *tap.Info) (context.Context, error) {
	ctx, cancel := context.WithCancel(stream)
	w := &requestWait{cancel: cancel}
	w.timer = time.AfterFunc(h.timeout, func() {
		if stream.Err() != nil {
			return // the call is over already
		}
		if h.timedOut != nil {
			h.timedOut()
		}
		cancel()
	})
	context.AfterFunc(stream, func() {
		w.timer.Stop()
		cancel()
	})
	return context.WithValue(ctx, requestWaitKey{}, w), nil
}

// TagRPC returns ctx, which carries the tap's timer.
func (requestRead) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC stops the timer at the call's first message in and releases
// it at the call's end.
func (h requestRead) HandleRPC(ctx context.Context, s stats.RPCStats) {
	w, _ := ctx.Value(requestWaitKey{}).(*requestWait)
	if w == nil {
		return
	}
	switch s.(type) {
	case *stats.InPayload:
		w.timer.Stop()
	case *stats.End:
		w.timer.Stop()
		w.cancel()
	}
}

// TagConn returns ctx: connections are not tagged.
func (requestRead) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

// HandleConn does nothing: connections are bounded by the listener's
// limit and the keepalive options (connOptions).
func (requestRead) HandleConn(context.Context, stats.ConnStats) {}
