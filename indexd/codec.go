package indexd

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// deferredCodec is the server's codec: protobuf, except that a request
// decoded through a deferred (which only the API's handlers pass, see
// decodeRequest) records its decoding error instead of returning it.
//
// Why: grpc-go turns a codec error into INTERNAL ("failed to unmarshal the
// received message") before any handler or interceptor runs, and a
// malformed request is the caller's fault, not the server's. With the
// error kept, the handler answers INVALID_ARGUMENT. Health and reflection
// calls decode as usual.
//
// The codec also refuses, before decoding, what a handler would refuse
// after it at a far higher cost: a request whose encoding is past
// MaxRequestBytes (gRPC reads up to twice that, transportLimit), and a
// LookupRequest past a count limit (precheckLookup). The refusal is kept
// in the deferred as refused, and the handler answers INVALID_ARGUMENT
// with the message the checks of the decoded request give.
type deferredCodec struct {
	proto encoding.CodecV2
	cfg   Config
}

// deferred carries a request message through the codec and brings back
// its decoding error, or the limit it was refused for undecoded.
type deferred struct {
	msg     any
	err     error
	refused error
}

func newDeferredCodec(cfg Config) deferredCodec {
	return deferredCodec{proto: encoding.GetCodecV2("proto"), cfg: cfg}
}

// Name is "proto": the codec serves the proto content subtype.
func (c deferredCodec) Name() string { return c.proto.Name() }

// Marshal encodes v as protobuf.
func (c deferredCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

// Unmarshal decodes data into v, or into a deferred's message, keeping
// that decoding error in the deferred.
func (c deferredCodec) Unmarshal(data mem.BufferSlice, v any) error {
	d, ok := v.(*deferred)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	if n := data.Len(); n > c.cfg.MaxRequestBytes {
		d.refused = errTooLarge(n, c.cfg.MaxRequestBytes)
		return nil
	}
	if _, ok := d.msg.(*kvindexv1.LookupRequest); ok {
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		if d.refused = c.cfg.precheckLookup(buf.ReadOnlyData()); d.refused != nil {
			return nil
		}
		data = mem.BufferSlice{buf}
	}
	d.err = c.proto.Unmarshal(data, d.msg)
	return nil
}

// decodeRequest wraps a handler's decode function: a request that reads
// off the wire but does not decode is INVALID_ARGUMENT naming the method;
// a transport error (size limit, cancelled stream) passes unchanged.
func decodeRequest(method string, dec func(any) error) func(any) error {
	return func(v any) error {
		d := &deferred{msg: v}
		if err := dec(d); err != nil {
			return err
		}
		if d.refused != nil {
			return status.Error(codes.InvalidArgument, d.refused.Error())
		}
		if d.err != nil {
			return status.Error(codes.InvalidArgument, fmt.Sprintf("%v: %s request is not a valid protobuf message: %v", ErrInvalidArgument, method, d.err))
		}
		return nil
	}
}
