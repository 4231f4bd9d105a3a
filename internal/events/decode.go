package events

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/kvindex/kvindex/internal/tier"
)

// Decoder decodes KVEventBatch payloads. It holds the payload being
// decoded and caches the last medium and spec kind between calls, so it is
// not safe for concurrent use: give each goroutine its own.
type Decoder struct {
	// mediums is the MediumMap keyed by folded names.
	mediums map[string]tier.Tier
	r       reader // the payload being decoded
	// hashSpace and tokenSpace hand out the batch's BlockHashes and
	// TokenIDs; Decode starts both afresh, so a batch never shares them
	// with the next, and DecodeInto reuses them unless lent says a batch
	// of Decode's still holds their blocks.
	hashSpace  arena[uint64]
	tokenSpace arena[int64]
	lent       bool
	// medium caches the last medium string so a batch of events on one
	// medium allocates it once; mediumTier and mediumOK are its tier.
	medium     string
	mediumTier tier.Tier
	mediumOK   bool
	// kind caches the last kv_cache_spec_kind that is not a known constant.
	kind string
	// msgs is the space of the current event's field problems
	// (eventState.msgs); an entry counts only while its bit is set.
	msgs [fieldCount]string
}

// NewDecoder returns a decoder that maps mediums through mediums,
// case-insensitively; nil means DefaultMediums(). The decoder keeps its own
// copy. A map that fails Validate should be refused by the caller's config
// check; given one anyway, one of two conflicting spellings wins and a name
// mapped to no real tier is an unknown medium.
func NewDecoder(mediums MediumMap) *Decoder {
	if mediums == nil {
		mediums = DefaultMediums()
	}
	return &Decoder{mediums: mediums.folded()}
}

// Decode decodes one payload (a Kafka record value). The returned batch
// owns its slices; it does not alias payload or the decoder. On an error
// wrapping ErrMalformedBatch the whole payload must be skipped; per-event
// problems are reported in Batch.Skipped instead.
func (d *Decoder) Decode(payload []byte) (Batch, error) {
	// Sized for the common shape: a hash or more per 100 payload bytes,
	// a token per 8 (token ids take 1-5 bytes each, beside the rest).
	d.hashSpace, d.tokenSpace = arena[uint64]{first: len(payload) / 100}, arena[int64]{first: len(payload) / 8}
	d.lent = true
	var b Batch
	if err := d.decode(&b, payload); err != nil {
		return Batch{}, err
	}
	return b, nil
}

// DecodeInto decodes payload into b as Decode does, reusing memory: b's
// Events and Skipped, and the decoder's blocks for BlockHashes and
// TokenIDs. It is for a caller that is done with one batch before it
// decodes the next (the ingester's applier, which keeps no slice of a
// record's events past the record): the batch DecodeInto filled last on
// this decoder, and every slice of it, is overwritten by the next call.
// Batches from Decode are never overwritten. The result equals Decode's
// but that an empty Events or Skipped may be non-nil. Errors are Decode's;
// on one, b holds no events.
func (d *Decoder) DecodeInto(b *Batch, payload []byte) error {
	if d.lent {
		d.hashSpace, d.tokenSpace, d.lent = arena[uint64]{}, arena[int64]{}, false
	}
	d.hashSpace.reuse(len(payload) / 100)
	d.tokenSpace.reuse(len(payload) / 8)
	evs, skipped := emptied(b.Events), emptied(b.Skipped)
	*b = Batch{Events: evs, Skipped: skipped}
	if err := d.decode(b, payload); err != nil {
		*b = Batch{Events: emptied(b.Events), Skipped: emptied(b.Skipped)}
		return err
	}
	return nil
}

// emptied returns s emptied for reuse: its elements zeroed, so what they
// pointed at (an outsized arena block, an earlier batch's extra keys) is
// not kept alive by the spare capacity, and nil past maxEventsKept. Every
// element past len(s) is already zero: each batch's are zeroed here before
// the next reuses them.
func emptied[T any](s []T) []T {
	if cap(s) > maxEventsKept {
		return nil
	}
	clear(s)
	return s[:0]
}

// maxEventsKept bounds the Events and Skipped capacity DecodeInto keeps
// from one batch to the next, so one outsized batch does not pin its
// memory.
const maxEventsKept = 4096

// decode decodes payload into the zeroed b, with the arenas set up.
func (d *Decoder) decode(b *Batch, payload []byte) error {
	d.r.reset(payload)
	defer d.r.reset(nil)
	if err := d.decodeBatch(b); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformedBatch, err)
	}
	if n := d.r.len(); n > 0 {
		return fmt.Errorf("%w: %d trailing bytes after the batch", ErrMalformedBatch, n)
	}
	return nil
}

func (d *Decoder) decodeBatch(b *Batch) error {
	c, err := d.r.peek()
	if err != nil {
		return fmt.Errorf("empty payload: %w", err)
	}
	if isMap(c) {
		return d.decodeBatchMap(b)
	}
	if !isArray(c) {
		return fmt.Errorf("batch is %s, want array [ts, events, data_parallel_rank] or map", describe(c))
	}
	n, err := d.arrayLen("batch")
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("batch has %d elements, want at least 2 (ts, events)", n)
	}
	if err := d.decodeTS(b); err != nil {
		return err
	}
	if err := d.decodeEvents(b); err != nil {
		return err
	}
	if n >= 3 {
		if err := d.decodeRank(b); err != nil {
			return err
		}
	}
	for i := 3; i < n; i++ {
		if err := d.skip(fmt.Sprintf("batch element %d", i)); err != nil {
			return err
		}
	}
	return nil
}

// decodeBatchMap decodes a batch sent as a map (engines whose batch struct
// is not msgspec array_like, such as vLLM's newest EventBatch): "ts" and
// "events" are required, "data_parallel_rank" is optional (omitted when
// nil), keys come in any order, and other keys, string or not, are ignored
// like unknown event fields. A repeated known key is malformed: which copy
// the engine meant is not knowable.
func (d *Decoder) decodeBatchMap(b *Batch) error {
	n, err := d.r.mapLen()
	if err != nil {
		return fmt.Errorf("batch map: %w", err)
	}
	if 2*n > d.r.len() {
		return fmt.Errorf("batch map claims %d entries but only %d bytes remain", n, d.r.len())
	}
	var sawTS, sawEvents, sawRank bool
	for j := 0; j < n; j++ {
		c, err := d.r.peek()
		if err != nil {
			return fmt.Errorf("batch map key: %w", err)
		}
		name := ""
		if isStr(c) {
			key, err := d.str("batch map key")
			if err != nil {
				return err
			}
			name = batchKey(key)
		} else if err := d.skip("batch map key"); err != nil {
			return err
		}
		var seen *bool
		switch name {
		case "ts":
			seen = &sawTS
		case "events":
			seen = &sawEvents
		case "data_parallel_rank":
			seen = &sawRank
		default:
			if err := d.skip("ignored batch field"); err != nil {
				return err
			}
			continue
		}
		if *seen {
			return fmt.Errorf("batch map repeats %q", name)
		}
		*seen = true
		switch name {
		case "ts":
			err = d.decodeTS(b)
		case "events":
			err = d.decodeEvents(b)
		default:
			err = d.decodeRank(b)
		}
		if err != nil {
			return err
		}
	}
	switch {
	case !sawTS:
		return fmt.Errorf(`batch map has no "ts"`)
	case !sawEvents:
		return fmt.Errorf(`batch map has no "events"`)
	}
	return nil
}

// batchKey returns the constant name of a batch map key this decoder
// reads, or "" for one it ignores; like fieldName it neither allocates nor
// retains key.
func batchKey(key []byte) string {
	switch string(key) {
	case "ts":
		return "ts"
	case "events":
		return "events"
	case "data_parallel_rank":
		return "data_parallel_rank"
	}
	return ""
}

// decodeTS decodes the batch timestamp, which must be finite: it is stored
// in the endpoint record and compared for sequence decisions, so only a
// real time is meaningful.
func (d *Decoder) decodeTS(b *Batch) error {
	ts, err := d.float("ts")
	if err != nil {
		return err
	}
	if math.IsNaN(ts) || math.IsInf(ts, 0) {
		return fmt.Errorf("ts is %v, want a finite number", ts)
	}
	b.TS = ts
	return nil
}

func (d *Decoder) decodeEvents(b *Batch) error {
	c, err := d.r.peek()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	if c == msgpcode.Nil {
		d.r.skipNil()
		return nil
	}
	if !isArray(c) {
		return fmt.Errorf("events is %s, want array", describe(c))
	}
	n, err := d.arrayLen("events")
	if err != nil {
		return err
	}
	// Grow from a bounded start: a header may claim up to one event per
	// remaining byte, and an Event is far larger than a byte.
	if want := min(n, maxEventsPrealloc); b.Events == nil || cap(b.Events) < want {
		b.Events = make([]Event, 0, want)
	}
	for i := 0; i < n; i++ {
		// Each event is decoded in its place in Events, which spares
		// copying the Event (over 200 bytes) from the decoder's state to
		// the result; a skipped one is zeroed and given back, so the
		// spare capacity stays zero as emptied expects.
		b.Events = append(b.Events, Event{Index: i})
		last := len(b.Events) - 1
		skip, err := d.decodeEvent(&b.Events[last])
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if skip != nil {
			b.Events[last] = Event{}
			b.Events = b.Events[:last]
			b.Skipped = append(b.Skipped, *skip)
		}
	}
	return nil
}

// maxEventsPrealloc bounds the events slice allocated before the events are
// actually decoded.
const maxEventsPrealloc = 256

func (d *Decoder) decodeRank(b *Batch) error {
	c, err := d.r.peek()
	if err != nil {
		return fmt.Errorf("data_parallel_rank: %w", err)
	}
	if c == msgpcode.Nil {
		d.r.skipNil()
		return nil
	}
	if !isInteger(c) {
		return fmt.Errorf("data_parallel_rank is %s, want int or nil", describe(c))
	}
	u, neg, err := d.integer()
	if err != nil {
		return fmt.Errorf("data_parallel_rank: %w", err)
	}
	if neg || u > math.MaxUint32 {
		return fmt.Errorf("data_parallel_rank %s is out of range [0, %d]", intText(u, neg), uint32(math.MaxUint32))
	}
	b.Rank, b.HasRank = uint32(u), true
	return nil
}

// eventState collects one event's fields while it is decoded, into ev (its
// place in the batch's Events). bad marks, by bit, the fields with a
// problem that makes the event invalid without breaking the msgpack
// structure (the event's own shape, such as a missing tag, under
// fieldType); msgs holds each marked field's first problem, in the
// Decoder's space, so a clean event writes no message and clears none.
// finish counts only the fields that belong to the event's type, because
// a map event's tag may come after its fields and a field of another type
// is ignored (DESIGN "Event wire format"). cur is the field being decoded.
type eventState struct {
	ev        *Event
	tag       string
	known     bool
	hasHashes bool
	cur       eventField
	seen      uint16 // map events: the fields read so far, by bit
	bad       uint16 // the fields with a problem, by bit
	msgs      *[fieldCount]string
}

// The field bitmasks of eventState hold every eventField.
var _ [16 - fieldCount]struct{}

// fail records a problem of the field being decoded, unless it has one.
func (s *eventState) fail(format string, args ...any) {
	if bit := uint16(1) << s.cur; s.bad&bit == 0 {
		s.bad |= bit
		s.msgs[s.cur] = fmt.Sprintf(format, args...)
	}
}

// failShape records a problem of the event as a whole (its tag, its map).
func (s *eventState) failShape(format string, args ...any) {
	s.cur = fieldType
	s.fail(format, args...)
}

// problem returns the first recorded problem of a field that belongs to
// the event's type, in the type's field order (only the shape's for an
// unknown type, whose tag is then the only thing that counts), or "".
func (s *eventState) problem() string {
	switch {
	case s.bad == 0:
		return ""
	case s.bad&(1<<fieldType) != 0:
		return s.msgs[fieldType]
	case !s.known:
		return ""
	}
	for _, f := range typeFields(s.ev.Type) {
		if s.bad&(1<<f) != 0 {
			return s.msgs[f]
		}
	}
	return ""
}

// eventField is an event field this decoder reads, by its wire name
// (fieldNames); fieldIgnored stands for any other, whose value is skipped.
// Fields are told apart once, from the map key or the array position, and
// dispatched by number after that.
type eventField uint8

const (
	fieldIgnored eventField = iota
	fieldType
	fieldBlockHashes
	fieldParentBlockHash
	fieldTokenIDs
	fieldBlockSize
	fieldMedium
	fieldLoraName
	fieldExtraKeys
	fieldGroupIdx
	fieldKVCacheSpecKind
	fieldCount // the number of fields above
)

// fieldNames are the fields' wire names, as vLLM's kv_events structs name
// them; they label errors and skips.
var fieldNames = [...]string{
	fieldIgnored:         "ignored field",
	fieldType:            "type",
	fieldBlockHashes:     "block_hashes",
	fieldParentBlockHash: "parent_block_hash",
	fieldTokenIDs:        "token_ids",
	fieldBlockSize:       "block_size",
	fieldMedium:          "medium",
	fieldLoraName:        "lora_name",
	fieldExtraKeys:       "extra_keys",
	fieldGroupIdx:        "group_idx",
	fieldKVCacheSpecKind: "kv_cache_spec_kind",
}

// Field positions after the tag in the tagged-array encoding (msgspec
// array_like structs, in vLLM's declaration order): BlockStored's lora_id
// and kv_cache_spec_sliding_window are read as ignored fields.
var (
	storedFields = []eventField{fieldBlockHashes, fieldParentBlockHash, fieldTokenIDs, fieldBlockSize, fieldIgnored, fieldMedium,
		fieldLoraName, fieldExtraKeys, fieldGroupIdx, fieldKVCacheSpecKind, fieldIgnored}
	removedFields     = []eventField{fieldBlockHashes, fieldMedium, fieldGroupIdx}
	tierClearedFields = []eventField{fieldMedium}
)

// typeFields returns the fields that belong to an event type, in their
// tagged-array positions (nil for AllBlocksCleared, which has none).
func typeFields(t Type) []eventField {
	switch t {
	case BlockStored:
		return storedFields
	case BlockRemoved:
		return removedFields
	case TierBlocksCleared:
		return tierClearedFields
	}
	return nil
}

// decodeEvent decodes the next event into ev, which holds only its Index,
// and reports it as a skip instead when it is invalid or of an unknown
// type (ev is then the caller's to discard).
func (d *Decoder) decodeEvent(ev *Event) (*Skip, error) {
	s := eventState{ev: ev, msgs: &d.msgs}
	c, err := d.r.peek()
	if err != nil {
		return nil, err
	}
	switch {
	case isArray(c):
		err = d.decodeArrayEvent(&s)
	case isMap(c):
		err = d.decodeMapEvent(&s)
	default:
		if err := d.skip("event"); err != nil {
			return nil, err
		}
		return &Skip{Index: ev.Index, Reason: SkipInvalid, Detail: fmt.Sprintf("event is %s, want tagged array or map", describe(c))}, nil
	}
	if err != nil {
		return nil, err
	}
	return d.finish(&s), nil
}

func (d *Decoder) decodeArrayEvent(s *eventState) error {
	n, err := d.arrayLen("event")
	if err != nil {
		return err
	}
	if n == 0 {
		s.failShape("empty event array has no type tag")
		return nil
	}
	if err := d.decodeTag(s); err != nil {
		return err
	}
	fields := typeFields(s.ev.Type)
	for j := 1; j < n; j++ {
		f := fieldIgnored
		if j-1 < len(fields) {
			f = fields[j-1]
		}
		if err := d.decodeField(s, f); err != nil {
			return err
		}
	}
	return nil
}

func (d *Decoder) decodeMapEvent(s *eventState) error {
	n, err := d.r.mapLen()
	if err != nil {
		return fmt.Errorf("event map: %w", err)
	}
	if 2*n > d.r.len() {
		return fmt.Errorf("event map claims %d entries but only %d bytes remain", n, d.r.len())
	}
	sawType := false
	for j := 0; j < n; j++ {
		c, err := d.r.peek()
		if err != nil {
			return fmt.Errorf("event map key: %w", err)
		}
		if !isStr(c) {
			// Not a field name: ignore the entry, as for unknown fields.
			if err := d.skip("event map key"); err != nil {
				return err
			}
			if err := d.skip("event map value"); err != nil {
				return err
			}
			continue
		}
		key, err := d.str("event map key")
		if err != nil {
			return err
		}
		f := fieldOf(key)
		if f != fieldIgnored && f != fieldType {
			// A field given twice is refused, not settled by its last
			// value (a second medium would move a removal to another
			// tier); it counts only if the field belongs to the type.
			if bit := uint16(1) << f; s.seen&bit != 0 {
				s.cur = f
				s.fail("field %s is given more than once", fieldNames[f])
			} else {
				s.seen |= bit
			}
		}
		if f == fieldType {
			if sawType {
				s.failShape(`event map has more than one "type" field`)
			}
			sawType = true
			if err := d.decodeTag(s); err != nil {
				return err
			}
			continue
		}
		if err := d.decodeField(s, f); err != nil {
			return err
		}
	}
	if !sawType {
		s.failShape(`event map has no "type" field`)
	}
	return nil
}

// fieldOf returns the field a map key names, fieldIgnored for one this
// decoder does not read. key aliases the payload, so it must not be
// retained; the switch neither allocates nor retains it.
func fieldOf(key []byte) eventField {
	switch string(key) {
	case "type":
		return fieldType
	case "block_hashes":
		return fieldBlockHashes
	case "parent_block_hash":
		return fieldParentBlockHash
	case "token_ids":
		return fieldTokenIDs
	case "block_size":
		return fieldBlockSize
	case "medium":
		return fieldMedium
	case "lora_name":
		return fieldLoraName
	case "extra_keys":
		return fieldExtraKeys
	case "group_idx":
		return fieldGroupIdx
	case "kv_cache_spec_kind":
		return fieldKVCacheSpecKind
	}
	return fieldIgnored
}

func (d *Decoder) decodeTag(s *eventState) error {
	c, err := d.r.peek()
	if err != nil {
		return fmt.Errorf("event type tag: %w", err)
	}
	if !isStr(c) {
		s.failShape("type tag is %s, want string", describe(c))
		return d.skip("event type tag")
	}
	tag, err := d.str("event type tag")
	if err != nil {
		return err
	}
	if t, ok := parseType(tag); ok {
		s.ev.Type, s.known, s.tag = t, true, t.String()
		return nil
	}
	s.tag = string(tag)
	return nil
}

// decodeField decodes field f into s, or skips the value when f is
// fieldIgnored (or fieldType out of place: an array event's tag is read
// before its fields, so a type in a field's position is not one).
func (d *Decoder) decodeField(s *eventState, f eventField) error {
	name := fieldNames[f]
	s.cur = f
	switch f {
	case fieldBlockHashes:
		s.hasHashes = true
		hashes, err := d.hashes(s, name)
		s.ev.BlockHashes = hashes
		return err
	case fieldParentBlockHash:
		c, err := d.r.peek()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if c == msgpcode.Nil {
			d.r.skipNil()
			return nil
		}
		h, ok, err := d.hash(s, name, -1)
		s.ev.ParentHash, s.ev.HasParent = h, ok
		return err
	case fieldTokenIDs:
		ids, err := d.tokens(s, name)
		s.ev.TokenIDs = ids
		return err
	case fieldBlockSize:
		u, ok, err := d.optUint(s, name, math.MaxUint32)
		if ok {
			s.ev.BlockSize = uint32(u)
		}
		return err
	case fieldMedium:
		m, err := d.optStr(s, name, &d.medium)
		s.ev.Medium = m
		return err
	case fieldLoraName:
		m, err := d.optStr(s, name, &d.medium)
		s.ev.LoraName = m
		return err
	case fieldExtraKeys:
		return d.extraKeys(s, name)
	case fieldKVCacheSpecKind:
		k, err := d.optStr(s, name, &d.kind)
		s.ev.KVCacheSpecKind = k
		return err
	case fieldGroupIdx:
		c, err := d.r.peek()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if c == msgpcode.Nil {
			d.r.skipNil()
			return nil
		}
		if !isInteger(c) {
			s.fail("field %s is %s, want int or nil", name, describe(c))
			return d.skip(name)
		}
		u, neg, err := d.integer()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if neg || u > math.MaxInt64 {
			s.fail("field %s %s is out of range [0, %d]", name, intText(u, neg), int64(math.MaxInt64))
		}
		s.ev.GroupIdx = int64(u)
		return nil
	}
	return d.skip("ignored field")
}

// finish validates a decoded event and resolves its tier, in place; an
// event that cannot apply comes back as a skip.
func (d *Decoder) finish(s *eventState) *Skip {
	ev := s.ev
	skip := func(r SkipReason, format string, args ...any) *Skip {
		return &Skip{Index: ev.Index, Tag: s.tag, Reason: r, Detail: fmt.Sprintf(format, args...)}
	}
	if m := s.problem(); m != "" {
		return skip(SkipInvalid, "%s", m)
	}
	if !s.known {
		return skip(SkipUnknownType, "unknown event type %q", s.tag)
	}
	switch ev.Type {
	case AllBlocksCleared:
		*ev = Event{Type: AllBlocksCleared, Index: ev.Index}
		return nil
	case TierBlocksCleared:
		t, ok := d.tierOf(ev.Medium)
		if !ok {
			return skip(SkipUnknownMedium, "medium %q maps to no tier", ev.Medium)
		}
		*ev = Event{Type: TierBlocksCleared, Index: ev.Index, Medium: ev.Medium, Tier: t}
		return nil
	}
	if !s.hasHashes {
		return skip(SkipInvalid, "missing field block_hashes")
	}
	t, ok := d.tierOf(ev.Medium)
	if !ok {
		return skip(SkipUnknownMedium, "medium %q maps to no tier", ev.Medium)
	}
	ev.Tier = t
	if ev.Type == BlockRemoved {
		// Only the hashes, medium, tier and group belong to a removal.
		ev.ParentHash, ev.HasParent, ev.TokenIDs, ev.BlockSize, ev.LoraName, ev.KVCacheSpecKind = 0, false, nil, 0, "", ""
		ev.ExtraKeys, ev.HasExtraKeys, ev.ExtraKeysLen, ev.BadExtraKeys = nil, false, 0, ""
	}
	return nil
}

// tierOf maps a medium to its tier, case-insensitively. The answer for the
// last medium is cached: a batch's events are nearly always on one or two
// mediums, and a lower-case name costs an allocation to fold.
func (d *Decoder) tierOf(medium string) (tier.Tier, bool) {
	if medium == d.medium && d.mediumOK {
		return d.mediumTier, true
	}
	t, ok := d.mediums[foldMedium(medium)]
	ok = ok && t.Valid()
	if medium == d.medium {
		d.mediumTier, d.mediumOK = t, ok
	}
	return t, ok
}

// hashes decodes a list of block hashes. A nil or mistyped list, or a bad
// element, makes the event invalid.
func (d *Decoder) hashes(s *eventState, name string) ([]uint64, error) {
	c, err := d.r.peek()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if !isArray(c) {
		s.fail("field %s is %s, want array", name, describe(c))
		return nil, d.skip(name)
	}
	n, err := d.arrayLen(name)
	if err != nil {
		return nil, err
	}
	out := d.hashSpace.take(n)
	for k := 0; k < n; k++ {
		h, _, err := d.hash(s, name, k)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

// minDigestLen is the shortest byte hash accepted: the 64-bit form is its
// last 8 bytes.
const minDigestLen = 8

// hash decodes one block hash: a uint64, an int64 reinterpreted as uint64,
// or a byte digest of at least 8 bytes whose last 8 bytes are read
// big-endian. ok is false when the value was skipped as invalid. index is
// the element's position in a list, or -1 for a single hash.
func (d *Decoder) hash(s *eventState, name string, index int) (h uint64, ok bool, err error) {
	c, err := d.r.peek()
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", label(name, index), err)
	}
	switch {
	case isInteger(c):
		u, _, err := d.integer()
		if err != nil {
			return 0, false, fmt.Errorf("%s: %w", label(name, index), err)
		}
		return u, true, nil
	case isBin(c):
		b, err := d.bin(name)
		if err != nil {
			return 0, false, fmt.Errorf("%s: %w", label(name, index), err)
		}
		if len(b) < minDigestLen {
			s.fail("field %s has a %d-byte hash, want at least %d bytes", label(name, index), len(b), minDigestLen)
			return 0, false, nil
		}
		return binary.BigEndian.Uint64(b[len(b)-8:]), true, nil
	}
	s.fail("field %s is %s, want int or bytes", label(name, index), describe(c))
	return 0, false, d.skip(name)
}

// label names a field, or an element of a list field when index >= 0. It is
// called only on error paths.
func label(name string, index int) string {
	if index < 0 {
		return name
	}
	return fmt.Sprintf("%s[%d]", name, index)
}

func (d *Decoder) tokens(s *eventState, name string) ([]int64, error) {
	c, err := d.r.peek()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if c == msgpcode.Nil {
		d.r.skipNil()
		return nil, nil
	}
	if !isArray(c) {
		s.fail("field %s is %s, want array", name, describe(c))
		return nil, d.skip(name)
	}
	n, err := d.arrayLen(name)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	out := d.tokenSpace.take(n)
	// Fast path: token ids are a long run of plain integers, so read them
	// straight from the payload bytes instead of through the msgpack
	// decoder (this halves the decode time of a typical BlockStored; see
	// BENCHMARKS.md). It stops at the first element that is not an
	// integer, and the loop below takes over from there.
	out, k, err := d.rawInts(out, n)
	if err != nil {
		return nil, fmt.Errorf("%s[%d]: %w", name, k, err)
	}
	for ; k < n; k++ {
		c, err := d.r.peek()
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", name, k, err)
		}
		if !isInteger(c) {
			s.fail("field %s element %d is %s, want int", name, k, describe(c))
			if err := d.skip(name); err != nil {
				return nil, err
			}
			continue
		}
		u, neg, err := d.integer()
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", name, k, err)
		}
		if !neg && u > math.MaxInt64 {
			s.fail("field %s element %d (%d) is out of range", name, k, u)
		}
		out = append(out, int64(u))
	}
	return out, nil
}

// rawInts appends up to n msgpack integers read straight from the payload
// and advances the reader past them: token ids are a long run of small
// integers, read here in one tight loop. It returns how many it read:
// fewer than n when it met a value that is not an integer (left unread for
// the caller) or one that does not fit an int64 (also left unread, so the
// caller reports it). A truncated integer is an error.
func (d *Decoder) rawInts(out []int64, n int) ([]int64, int, error) {
	b := d.r.rest()
	base := len(out)
	out = slices.Grow(out, n)
	dst := out[base : base+n] // written by index: no append's capacity check per id
	i, k := 0, 0
	defer func() { d.r.advance(i) }()
	for ; k < len(dst) && i < len(b); k++ {
		c := b[i]
		if c <= msgpcode.PosFixedNumHigh {
			dst[k] = int64(c)
			i++
			continue
		}
		if c >= msgpcode.NegFixedNumLow {
			dst[k] = int64(int8(c))
			i++
			continue
		}
		// One switch reads each format in place: vocabularies past 65,535
		// ids make uint32 the common case, then uint16.
		v := b[i+1:]
		var x int64
		switch c {
		case msgpcode.Uint32, msgpcode.Int32:
			if len(v) < 4 {
				return out[:base+k], k, errIntTruncated(len(v), 4)
			}
			if u := binary.BigEndian.Uint32(v); c == msgpcode.Uint32 {
				x = int64(u)
			} else {
				x = int64(int32(u))
			}
			i += 5
		case msgpcode.Uint16, msgpcode.Int16:
			if len(v) < 2 {
				return out[:base+k], k, errIntTruncated(len(v), 2)
			}
			if u := binary.BigEndian.Uint16(v); c == msgpcode.Uint16 {
				x = int64(u)
			} else {
				x = int64(int16(u))
			}
			i += 3
		case msgpcode.Uint8, msgpcode.Int8:
			if len(v) < 1 {
				return out[:base+k], k, errIntTruncated(len(v), 1)
			}
			if c == msgpcode.Uint8 {
				x = int64(v[0])
			} else {
				x = int64(int8(v[0]))
			}
			i += 2
		case msgpcode.Uint64, msgpcode.Int64:
			if len(v) < 8 {
				return out[:base+k], k, errIntTruncated(len(v), 8)
			}
			u := binary.BigEndian.Uint64(v)
			if c == msgpcode.Uint64 && u > math.MaxInt64 {
				return out[:base+k], k, nil // the caller reports it
			}
			x = int64(u)
			i += 9
		default:
			return out[:base+k], k, nil
		}
		dst[k] = x
	}
	return out[:base+k], k, nil
}

// errIntTruncated reports an integer whose payload the batch's end cut
// short.
func errIntTruncated(have, want int) error {
	return fmt.Errorf("integer truncated: %d bytes remain, want %d", have, want)
}

// optUint decodes a nil-able non-negative integer no larger than limit.
func (d *Decoder) optUint(s *eventState, name string, limit uint64) (uint64, bool, error) {
	c, err := d.r.peek()
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", name, err)
	}
	if c == msgpcode.Nil {
		d.r.skipNil()
		return 0, false, nil
	}
	if !isInteger(c) {
		s.fail("field %s is %s, want int or nil", name, describe(c))
		return 0, false, d.skip(name)
	}
	u, neg, err := d.integer()
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", name, err)
	}
	if neg || u > limit {
		s.fail("field %s %s is out of range [0, %d]", name, intText(u, neg), limit)
		return 0, false, nil
	}
	return u, true, nil
}

// optStr decodes a nil-able string; nil decodes as "". cache holds the last
// string decoded through it, returned instead of a new allocation when the
// bytes are equal.
func (d *Decoder) optStr(s *eventState, name string, cache *string) (string, error) {
	c, err := d.r.peek()
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	if c == msgpcode.Nil {
		d.r.skipNil()
		return "", nil
	}
	if !isStr(c) {
		s.fail("field %s is %s, want string or nil", name, describe(c))
		return "", d.skip(name)
	}
	b, err := d.str(name)
	if err != nil {
		return "", err
	}
	switch string(b) {
	case *cache:
		return *cache, nil
	case KindFullAttention:
		return KindFullAttention, nil
	case KindMLAAttention:
		return KindMLAAttention, nil
	}
	if cache == &d.medium {
		d.mediumOK = false
	}
	*cache = string(b)
	return *cache, nil
}

// integer decodes any msgpack integer (reader.integer); the caller has
// checked the code.
func (d *Decoder) integer() (u uint64, neg bool, err error) { return d.r.integer() }

// intText formats an integer as integer returned it: u is the value's
// int64 bits when neg, else the value.
func intText(u uint64, neg bool) string {
	if neg {
		return strconv.FormatInt(int64(u), 10)
	}
	return strconv.FormatUint(u, 10)
}

// float decodes a number (float32, float64 or an integer) as float64.
func (d *Decoder) float(name string) (float64, error) {
	c, err := d.r.peek()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	switch {
	case c == msgpcode.Float || c == msgpcode.Double:
		v, err := d.r.float()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		return v, nil
	case isInteger(c):
		u, neg, err := d.integer()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		if neg {
			return float64(int64(u)), nil
		}
		return float64(u), nil
	}
	return 0, fmt.Errorf("%s is %s, want float", name, describe(c))
}

// arrayLen reads an array header and checks that the claimed element count
// can fit in the remaining bytes (each element takes at least one), so no
// caller ever allocates for elements that are not there.
func (d *Decoder) arrayLen(name string) (int, error) {
	n, err := d.r.arrayLen()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	if n > d.r.len() {
		return 0, fmt.Errorf("%s claims %d elements but only %d bytes remain", name, n, d.r.len())
	}
	return n, nil
}

// str reads a string; the result aliases the payload and must be copied to
// be kept. The caller has checked the code is a string.
func (d *Decoder) str(name string) ([]byte, error) { return d.readBytes(name) }

// bin reads a byte string, like str.
func (d *Decoder) bin(name string) ([]byte, error) { return d.readBytes(name) }

func (d *Decoder) readBytes(name string) ([]byte, error) {
	b, err := d.r.bytes()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return b, nil
}

// skip skips one value of any type, bounding container headers by the
// remaining bytes first.
func (d *Decoder) skip(name string) error {
	c, err := d.r.peek()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if isArray(c) || isMap(c) {
		return d.skipDepth(name, c, 0)
	}
	return d.skipScalar(name)
}

// skipScalar skips a value that is not a container (reader.skipScalar:
// a hostile length header is checked, never allocated for).
func (d *Decoder) skipScalar(name string) error {
	if err := d.r.skipScalar(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// maxDepth bounds container nesting in skipped values; deeper payloads are
// rejected rather than recursed into.
const maxDepth = 64

func (d *Decoder) skipDepth(name string, c byte, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%s nests deeper than %d levels", name, maxDepth)
	}
	var n int
	var err error
	if isArray(c) {
		n, err = d.arrayLen(name)
	} else {
		var m int
		m, err = d.r.mapLen()
		if err == nil && 2*m > d.r.len() {
			err = fmt.Errorf("map claims %d entries but only %d bytes remain", m, d.r.len())
		}
		n = 2 * m
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	for k := 0; k < n; k++ {
		c, err := d.r.peek()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if isArray(c) || isMap(c) {
			if err := d.skipDepth(name, c, depth+1); err != nil {
				return err
			}
			continue
		}
		if err := d.skipScalar(name); err != nil {
			return err
		}
	}
	return nil
}

func isUint(c byte) bool {
	return c <= msgpcode.PosFixedNumHigh || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64)
}

func isInteger(c byte) bool {
	return isUint(c) || c >= msgpcode.NegFixedNumLow || (c >= msgpcode.Int8 && c <= msgpcode.Int64)
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isStr(c byte) bool { return msgpcode.IsString(c) }

func isBin(c byte) bool { return msgpcode.IsBin(c) }

// describe names the msgpack type of code c for error messages.
func describe(c byte) string {
	switch {
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.True || c == msgpcode.False:
		return "bool"
	case isInteger(c):
		return "int"
	case c == msgpcode.Float || c == msgpcode.Double:
		return "float"
	case isStr(c):
		return "string"
	case isBin(c):
		return "bytes"
	case isArray(c):
		return "array"
	case isMap(c):
		return "map"
	case msgpcode.IsExt(c):
		return "ext"
	}
	return fmt.Sprintf("invalid code 0x%02x", c)
}
