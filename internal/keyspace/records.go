package keyspace

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/internal/tier"
)

// HashMode says what the hash segment of an endpoint's block keys is.
type HashMode string

// The hash modes (DESIGN "Hashing").
const (
	// HashModeEngine keys blocks by the engine's own block hash (default).
	HashModeEngine HashMode = "engine"
	// HashModeToken keys blocks by a hash kvindex recomputes from token ids.
	HashModeToken HashMode = "token"
)

// LeaseID is an etcd lease ID. It is stored as the hex string etcdctl
// prints and accepts (`etcdctl lease timetolive 694d7b3c5c2b1e04`).
type LeaseID int64

// String renders the ID in hex, as etcdctl does.
func (id LeaseID) String() string { return strconv.FormatInt(int64(id), 16) }

// MarshalText implements encoding.TextMarshaler (hex).
func (id LeaseID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (hex).
func (id *LeaseID) UnmarshalText(b []byte) error {
	v, err := strconv.ParseInt(string(b), 16, 64)
	if err != nil {
		return fmt.Errorf("%w: lease id %q is not hex", ErrMalformedValue, b)
	}
	*id = LeaseID(v)
	return nil
}

// LeaseShard is one lease an endpoint's blocks in one tier are attached to.
// An (endpoint, tier) gets a further shard once Keys reaches the ingester's
// keys-per-lease limit, so revoking or expiring one lease never deletes more
// than that many keys in one etcd apply step (DESIGN "Writes: leases").
type LeaseShard struct {
	// ID is the etcd lease.
	ID LeaseID `json:"id"`
	// Keys is an upper bound on the keys attached to the lease: puts
	// attached since the lease was granted, less deletes the writer knows
	// hit it.
	Keys int `json:"keys"`
}

// EndpointRecord is the value of endpoints/{model}/{pod}/{rank}: what the
// ingester knows of an endpoint, written with the endpoint's own lease in
// the transaction that advances the record's partition offset. It is JSON so
// operators can read it with etcdctl.
type EndpointRecord struct {
	// BlockSize is the engine's block size in tokens from its last
	// BlockStored that carried a non-zero one (in token mode, one whose
	// token ids keyed a block at it); 0 when unknown.
	BlockSize uint32 `json:"block_size,omitempty"`
	// HashMode says what the block keys' hash segment is. Decoding a
	// record that has none (written before v1.1) gives HashModeEngine.
	HashMode HashMode `json:"hash_mode"`
	// Seq is the engine sequence number (the record's "seq" header) of the
	// last applied batch record; nil when the endpoint's records carried
	// none (DESIGN semantics 7).
	Seq *uint64 `json:"seq,omitempty"`
	// BatchTS is the ts field of that batch, in seconds since the Unix
	// epoch as the engine wrote it.
	BatchTS float64 `json:"batch_ts,omitempty"`
	// Incarnation is the record's "incarnation" header when a bridge sent
	// one: an engine process identity.
	Incarnation string `json:"incarnation,omitempty"`
	// LastRecord is the partition-clock time of the endpoint's last batch
	// or heartbeat record (DESIGN semantics 8); liveness ages from it.
	LastRecord time.Time `json:"last_record"`
	// Topic and Partition locate the endpoint's records in Kafka.
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Lease is the lease this record is attached to.
	Lease LeaseID `json:"lease"`
	// TierLeases maps a tier name ("gpu", "cpu", "disk") to the lease
	// shards its block keys are attached to, oldest first; new keys go to
	// the last shard.
	TierLeases map[string][]LeaseShard `json:"tier_leases,omitempty"`
	// AttentionGroup is the KV-cache group the endpoint indexes, fixed by
	// its first attention store (DESIGN v1.1 "Event wire format"); nil
	// while it indexes group 0 provisionally.
	AttentionGroup *int64 `json:"attention_group,omitempty"`
	// MediumMap is the fingerprint of the medium map the endpoint's keys
	// were written under (events.MediumMap.Fingerprint); empty in records
	// written before v1.1. An ingester whose map has another fingerprint
	// drops the endpoint before its next record applies.
	MediumMap string `json:"medium_map,omitempty"`
	// ChunkNext maps a tier name to chunk_next, the sequence number the
	// writer gives the tier's next new chunk (DESIGN "The chunk rule
	// (writer)"); chunk ChunkNext-1, when it exists, is the one new blocks
	// fill. A tier absent here has chunk_next 0. It is written with the
	// offset, so a new owner that replays from the stored offset opens
	// the chunks the previous owner opened; readers ignore it.
	ChunkNext map[string]uint64 `json:"chunk_next,omitempty"`
}

// Shards returns the lease shards of tier t (nil when none).
func (r *EndpointRecord) Shards(t tier.Tier) []LeaseShard { return r.TierLeases[t.String()] }

// Marshal encodes the record as stored. It fails only for a time outside
// the years 0-9999.
func (r *EndpointRecord) Marshal() ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("keyspace: encoding endpoint record: %w", err)
	}
	return b, nil
}

// UnmarshalEndpointRecord decodes a stored endpoint record; unknown fields
// are ignored so that older readers accept newer writers' records. It
// returns ErrMalformedValue for anything that is not such a record.
func UnmarshalEndpointRecord(v []byte) (EndpointRecord, error) {
	if isNull(v) {
		return EndpointRecord{}, errNullRecord
	}
	var r EndpointRecord
	err := json.Unmarshal(v, &r)
	if err != nil {
		return EndpointRecord{}, fmt.Errorf("%w: endpoint record: %v", ErrMalformedValue, err)
	}
	if r.HashMode, err = checkHashMode(r.HashMode); err != nil {
		return EndpointRecord{}, err
	}
	for name := range r.TierLeases {
		if _, ok := tier.Parse(name); !ok {
			return EndpointRecord{}, fmt.Errorf("%w: endpoint record: unknown tier %q in tier_leases", ErrMalformedValue, name)
		}
	}
	for name, next := range r.ChunkNext {
		if _, ok := tier.Parse(name); !ok {
			return EndpointRecord{}, fmt.Errorf("%w: endpoint record: unknown tier %q in chunk_next", ErrMalformedValue, name)
		}
		if next > MaxChunkSeq+1 {
			return EndpointRecord{}, fmt.Errorf("%w: endpoint record: chunk_next %d of tier %s is past %d", ErrMalformedValue, next, name, uint64(MaxChunkSeq)+1)
		}
	}
	if r.AttentionGroup != nil && *r.AttentionGroup < 0 {
		return EndpointRecord{}, fmt.Errorf("%w: endpoint record: attention_group %d is negative", ErrMalformedValue, *r.AttentionGroup)
	}
	return r, nil
}

// isNull reports a JSON null, which json.Unmarshal takes as "no change":
// decoded, it would pass for an empty record.
func isNull(v []byte) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

var errNullRecord = fmt.Errorf("%w: endpoint record is null, want an object", ErrMalformedValue)

// EndpointMeta is the part of an EndpointRecord that readers listing
// endpoints need (indexd keeps it for ListEndpoints).
type EndpointMeta struct {
	BlockSize uint32
	// HashMode is the record's hash mode; HashModeEngine for a record
	// that names none (written before v1.1).
	HashMode   HashMode
	LastRecord time.Time
	Partition  int32
}

// endpointMetaJSON decodes EndpointMeta's fields and what validation needs
// (hash_mode, the tier_leases names); json skips the other fields, and the
// lease shards are decoded as empty structs, without their hex IDs.
type endpointMetaJSON struct {
	BlockSize  uint32                `json:"block_size"`
	HashMode   HashMode              `json:"hash_mode"`
	LastRecord time.Time             `json:"last_record"`
	Partition  int32                 `json:"partition"`
	TierLeases map[string][]struct{} `json:"tier_leases"`
}

// UnmarshalEndpointMeta decodes the EndpointMeta of a stored endpoint
// record without building the rest of it: indexd applies one record per
// endpoint per ingester window, and decoding the lease shards was a third
// of that cost (BENCHMARKS.md, "Where the time goes"). It returns
// ErrMalformedValue for what UnmarshalEndpointRecord rejects in the fields
// it reads (JSON null or not an object, an unknown hash_mode, an unknown
// tier in tier_leases), not for the fields only writers read: lease IDs
// that are not hex, chunk_next past 2^63 or of an unknown tier, a
// negative attention_group. Those are the ingester's business, and a
// reader that skipped the endpoint over them would drop blocks etcd
// holds.
func UnmarshalEndpointMeta(v []byte) (EndpointMeta, error) {
	if isNull(v) {
		return EndpointMeta{}, errNullRecord
	}
	var r endpointMetaJSON
	if err := json.Unmarshal(v, &r); err != nil {
		return EndpointMeta{}, fmt.Errorf("%w: endpoint record: %v", ErrMalformedValue, err)
	}
	mode, err := checkHashMode(r.HashMode)
	if err != nil {
		return EndpointMeta{}, err
	}
	for name := range r.TierLeases {
		if _, ok := tier.Parse(name); !ok {
			return EndpointMeta{}, fmt.Errorf("%w: endpoint record: unknown tier %q in tier_leases", ErrMalformedValue, name)
		}
	}
	return EndpointMeta{BlockSize: r.BlockSize, HashMode: mode, LastRecord: r.LastRecord, Partition: r.Partition}, nil
}

// checkHashMode returns a record's hash mode: an absent one (records
// written before v1.1 named none) is HashModeEngine, an unknown one is
// ErrMalformedValue.
func checkHashMode(m HashMode) (HashMode, error) {
	switch m {
	case "":
		return HashModeEngine, nil
	case HashModeEngine, HashModeToken:
		return m, nil
	}
	return "", fmt.Errorf("%w: endpoint record: unknown hash_mode %q", ErrMalformedValue, m)
}

// OwnerRecord is the value of owners/{topic}/{partition}: the ingester that
// last claimed the partition (DESIGN "Writes: fencing", last claimer wins).
type OwnerRecord struct {
	// MemberID is the claimer's Kafka consumer-group member ID.
	MemberID string `json:"member_id"`
	// Generation is the group generation of the claim.
	Generation int32 `json:"generation"`
	// Nonce is random per claim, so two claims never write equal values.
	Nonce string `json:"nonce"`
	// Ingester is the claimer's ingester id (its ingesters/ key).
	Ingester string `json:"ingester,omitempty"`
	// Claimed is the claimer's wall-clock time of the claim.
	Claimed time.Time `json:"claimed"`
}

// Marshal encodes the record as stored. It fails only for a time outside
// the years 0-9999.
func (r *OwnerRecord) Marshal() ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("keyspace: encoding owner record: %w", err)
	}
	return b, nil
}

// UnmarshalOwnerRecord decodes a stored owner record.
func UnmarshalOwnerRecord(v []byte) (OwnerRecord, error) {
	var r OwnerRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return OwnerRecord{}, fmt.Errorf("%w: owner record: %v", ErrMalformedValue, err)
	}
	return r, nil
}

// IngesterRecord is the value of ingesters/{id}, attached to the ingester's
// session lease so it disappears when the ingester does.
type IngesterRecord struct {
	// Host is the ingester's host name.
	Host string `json:"host"`
	// Started is when the ingester started.
	Started time.Time `json:"started"`
	// Partitions lists the partitions it owns, as "topic/partition".
	Partitions []string `json:"partitions"`
}

// Marshal encodes the record as stored. It fails only for a time outside
// the years 0-9999.
func (r *IngesterRecord) Marshal() ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("keyspace: encoding ingester record: %w", err)
	}
	return b, nil
}

// UnmarshalIngesterRecord decodes a stored ingester record.
func UnmarshalIngesterRecord(v []byte) (IngesterRecord, error) {
	var r IngesterRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return IngesterRecord{}, fmt.Errorf("%w: ingester record: %v", ErrMalformedValue, err)
	}
	return r, nil
}
