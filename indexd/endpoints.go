package indexd

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"sort"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kvindex/kvindex/internal/keyspace"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// ListEndpoints implements kvindex.v1.IndexService/ListEndpoints: one page
// (AIP-158) of the endpoints the serving index holds, ordered by model,
// pod, rank, starting after the endpoint the page token names.
//
// Each page is cut from the whole (model's) endpoint list of the index at
// the time of the call, so a page costs O(n log n) in the endpoints of the
// listing, not in the page; ListEndpoints is an operator view.
func (s *Server) ListEndpoints(_ context.Context, req *kvindexv1.ListEndpointsRequest) (*kvindexv1.ListEndpointsResponse, error) {
	resp, err := s.listEndpoints(req)
	return resp, toStatus(err)
}

func (s *Server) listEndpoints(req *kvindexv1.ListEndpointsRequest) (*kvindexv1.ListEndpointsResponse, error) {
	if err := s.checkSize(req); err != nil {
		return nil, err
	}
	if req.Model != "" {
		if err := keyspace.ValidateName("model", req.Model); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
	}
	size := int(req.PageSize)
	switch {
	case size < 0:
		return nil, fmt.Errorf("%w: page_size %d is negative", ErrInvalidArgument, size)
	case size == 0:
		size = s.cfg.ListPageSize
	case size > s.cfg.MaxListPageSize:
		size = s.cfg.MaxListPageSize
	}
	var after *keyspace.Endpoint
	if req.PageToken != "" {
		ep, err := decodePageToken(req.PageToken)
		if err != nil {
			return nil, err
		}
		if req.Model != "" && ep.Model != req.Model {
			return nil, fmt.Errorf("%w: page_token continues a list of another model than %q", ErrInvalidArgument, req.Model)
		}
		after = &ep
	}
	ix := s.refl.current()
	if ix == nil {
		return nil, ErrNotReady
	}
	infos, rev := ix.ListEndpoints(req.Model)
	start := 0
	if after != nil {
		start = sort.Search(len(infos), func(i int) bool { return keyspace.CompareEndpoints(infos[i].Endpoint, *after) > 0 })
	}
	end := min(start+size, len(infos))
	resp := &kvindexv1.ListEndpointsResponse{Revision: rev, Endpoints: make([]*kvindexv1.EndpointInfo, 0, end-start)}
	for _, e := range infos[start:end] {
		out := &kvindexv1.EndpointInfo{
			Model:      e.Endpoint.Model,
			Endpoint:   &kvindexv1.Endpoint{Pod: e.Endpoint.Pod, DpRank: e.Endpoint.Rank},
			GpuBlocks:  e.Blocks[0],
			CpuBlocks:  e.Blocks[1],
			DiskBlocks: e.Blocks[2],
			BlockSize:  e.BlockSize,
			Partition:  e.Partition,
			HashMode:   hashModeOf(e.HashMode),
		}
		if !e.LastSeen.IsZero() {
			out.LastSeen = timestamppb.New(e.LastSeen)
		}
		resp.Endpoints = append(resp.Endpoints, out)
	}
	if end < len(infos) {
		resp.NextPageToken = encodePageToken(infos[end-1].Endpoint)
	}
	return resp, nil
}

// pageTokenVersion is the first byte of every page token, so the format
// can change without misreading old tokens.
const pageTokenVersion = 1

// encodePageToken returns the page token that continues a list after ep:
// base64url (unpadded) of a version byte, then the model and the pod each
// as a uvarint length and the bytes, then the rank as a uvarint. It names
// only ep, so it holds on any replica and at any revision.
func encodePageToken(ep keyspace.Endpoint) string {
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+len(ep.Model)+len(ep.Pod))
	b = append(b, pageTokenVersion)
	b = binary.AppendUvarint(b, uint64(len(ep.Model)))
	b = append(b, ep.Model...)
	b = binary.AppendUvarint(b, uint64(len(ep.Pod)))
	b = append(b, ep.Pod...)
	b = binary.AppendUvarint(b, uint64(ep.Rank))
	return base64.RawURLEncoding.EncodeToString(b)
}

// maxPageTokenLen bounds the page tokens decodePageToken reads: the
// longest one encodePageToken makes (two names of keyspace.MaxNameLen).
var maxPageTokenLen = base64.RawURLEncoding.EncodedLen(1 + 3*binary.MaxVarintLen64 + 2*keyspace.MaxNameLen)

// decodePageToken parses a token of encodePageToken. Anything else is
// ErrInvalidArgument: a token is accepted only in the exact form
// encodePageToken gives, with valid names.
func decodePageToken(tok string) (keyspace.Endpoint, error) {
	bad := func(why string) (keyspace.Endpoint, error) {
		return keyspace.Endpoint{}, fmt.Errorf("%w: page_token is not one this API issued (%s)", ErrInvalidArgument, why)
	}
	if len(tok) > maxPageTokenLen {
		return bad("too long")
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(tok)
	if err != nil {
		return bad("not base64url")
	}
	if len(b) == 0 || b[0] != pageTokenVersion {
		return bad("unknown version")
	}
	b = b[1:]
	str := func() (string, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return "", false
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s, true
	}
	model, ok1 := str()
	pod, ok2 := str()
	if !ok1 || !ok2 {
		return bad("truncated")
	}
	rank, k := binary.Uvarint(b)
	if k <= 0 || k != len(b) || rank > uint64(^uint32(0)) {
		return bad("bad rank")
	}
	ep := keyspace.Endpoint{Model: model, Pod: pod, Rank: uint32(rank)}
	if keyspace.ValidateName("model", model) != nil || keyspace.ValidateName("pod", pod) != nil {
		return bad("bad names")
	}
	if encodePageToken(ep) != tok {
		return bad("not canonical")
	}
	return ep, nil
}

// hashModeOf is the API's HashMode of an endpoint record's mode;
// UNSPECIFIED without a record (or with one that did not decode).
func hashModeOf(m keyspace.HashMode) kvindexv1.HashMode {
	switch m {
	case keyspace.HashModeToken:
		return kvindexv1.HashMode_HASH_MODE_TOKEN
	case keyspace.HashModeEngine:
		return kvindexv1.HashMode_HASH_MODE_ENGINE
	}
	return kvindexv1.HashMode_HASH_MODE_UNSPECIFIED
}
