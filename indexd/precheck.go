package indexd

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of kvindex.v1 messages that precheckLookup counts
// (proto/kvindex/v1/index.proto).
const (
	lookupCandidatesField  = 3 // LookupRequest.candidates
	lookupBarrierField     = 4 // LookupRequest.barrier
	lookupTokensField      = 5 // LookupRequest.tokens
	barrierRecordsField    = 1 // Barrier.records
	tokensTokenIDsField    = 1 // TokenPrompt.token_ids
	tokensMultimodalsField = 4 // TokenPrompt.multimodal_items
)

// precheckLookup refuses, from its wire bytes and before it is decoded, a
// LookupRequest with more candidates, barrier records, multimodal items
// or token ids than the limits allow, with the error validateLookup gives
// for the decoded request. Decoding allocates far more than those fields
// take on the wire (an empty Endpoint message is 2 bytes and decodes to
// about 100 of memory): a hostile test measured 440 MiB allocated for
// one request of 8 MiB of empty candidates, before the size check could
// refuse it. Wire bytes it cannot parse are left to the decoder, which
// reports them.
func (c Config) precheckLookup(b []byte) error {
	var candidates, records, items, tokens int
	// packed holds the packed token_ids values: counting their varints
	// is the scan's only cost per byte, so it is done only when their
	// bytes (at least one per id) could be past MaxTokens.
	var packed [][]byte
	packedBytes := 0
	ok := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) {
		switch {
		case num == lookupCandidatesField && typ == protowire.BytesType:
			candidates++
		case num == lookupBarrierField && typ == protowire.BytesType:
			eachField(v, func(num protowire.Number, typ protowire.Type, _ []byte) {
				if num == barrierRecordsField && typ == protowire.BytesType {
					records++
				}
			})
		case num == lookupTokensField && typ == protowire.BytesType:
			eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) {
				switch {
				case num == tokensMultimodalsField && typ == protowire.BytesType:
					items++
				case num == tokensTokenIDsField && typ == protowire.BytesType: // packed
					packed, packedBytes = append(packed, v), packedBytes+len(v)
				case num == tokensTokenIDsField && typ == protowire.VarintType:
					tokens++
				}
			})
		}
	})
	if tokens+packedBytes > c.MaxTokens {
		for _, v := range packed {
			for _, x := range v {
				if x < 0x80 { // the last byte of a varint
					tokens++
				}
			}
		}
	}
	switch {
	case !ok:
		return nil
	case candidates > c.MaxCandidates:
		return errTooManyCandidates(candidates, c.MaxCandidates)
	case records > c.MaxBarrierRecords:
		return errTooManyRecords(records, c.MaxBarrierRecords)
	case items > c.MaxMultiModalItems:
		return errTooManyItems(items, c.MaxMultiModalItems)
	case tokens > c.MaxTokens:
		return errTooManyTokens(tokens, c.MaxTokens)
	}
	return nil
}

// eachField calls f with every field of the message encoded in b (a
// length-delimited field's value without its length), and reports
// whether b parsed to its end.
func eachField(b []byte, f func(protowire.Number, protowire.Type, []byte)) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return false
		}
		v := b[:m]
		if typ == protowire.BytesType {
			v, _ = protowire.ConsumeBytes(v)
		}
		f(num, typ, v)
		b = b[m:]
	}
	return true
}

// The errors of a request past a count limit, shared by precheckLookup
// and the checks of the decoded request.

func errTooManyCandidates(n, limit int) error {
	return fmt.Errorf("%w: candidates has %d endpoints, the limit is %d per request", ErrInvalidArgument, n, limit)
}

func errTooManyRecords(n, limit int) error {
	return fmt.Errorf("%w: barrier has %d records, the limit is %d", ErrInvalidArgument, n, limit)
}

func errTooManyItems(n, limit int) error {
	return fmt.Errorf("%w: tokens.multimodal_items has %d items, the limit is %d per request (--max-multimodal-items)", ErrInvalidArgument, n, limit)
}

func errTooManyTokens(n, limit int) error {
	return fmt.Errorf("%w: tokens.token_ids has %d tokens, the limit is %d per request (--max-tokens)", ErrInvalidArgument, n, limit)
}

// errTooLarge is the error of a request whose encoding is n bytes, past
// limit (MaxRequestBytes).
func errTooLarge(n, limit int) error {
	return fmt.Errorf("%w: request is %d bytes, the limit is %d bytes (--max-request-bytes)", ErrInvalidArgument, n, limit)
}
