package keyspace

import (
	"fmt"
	"strconv"
	"strings"
)

// Partition names one Kafka topic partition.
type Partition struct {
	Topic     string
	Partition int32
}

// String renders the partition as "topic/partition" for logs and errors.
func (p Partition) String() string {
	return p.Topic + "/" + strconv.FormatInt(int64(p.Partition), 10)
}

// OwnerKey is the fencing key of a partition: owners/{topic}/{partition}.
// Its value is an OwnerRecord; every write transaction of the partition's
// owner compares this key's ModRevision with the revision of its claim.
func (k Keyspace) OwnerKey(p Partition) string {
	return k.prefix + sectionOwners + escape(p.Topic) + "/" + strconv.FormatInt(int64(p.Partition), 10)
}

// ParseOwnerKey parses an owner key strictly.
func (k Keyspace) ParseOwnerKey(key string) (Partition, error) {
	return k.parsePartitionKey(key, sectionOwners)
}

// OffsetsPrefix is the prefix of every stored partition offset.
func (k Keyspace) OffsetsPrefix() string { return k.prefix + sectionOffsets }

// OffsetKey is the key of a partition's next offset to consume:
// offsets/{topic}/{partition}. Its value is FormatOffset's decimal.
func (k Keyspace) OffsetKey(p Partition) string {
	return k.prefix + sectionOffsets + escape(p.Topic) + "/" + strconv.FormatInt(int64(p.Partition), 10)
}

// ParseOffsetKey parses an offset key strictly.
func (k Keyspace) ParseOffsetKey(key string) (Partition, error) {
	return k.parsePartitionKey(key, sectionOffsets)
}

func (k Keyspace) parsePartitionKey(key, section string) (Partition, error) {
	rest, err := k.cut(key, section)
	if err != nil {
		return Partition{}, err
	}
	segs, err := split(key, rest, 2)
	if err != nil {
		return Partition{}, err
	}
	topic, err := unescape("topic", segs[0])
	if err != nil {
		return Partition{}, err
	}
	p, err := parseInt32("partition", segs[1])
	if err != nil {
		return Partition{}, err
	}
	return Partition{Topic: topic, Partition: p}, nil
}

// FormatOffset renders a partition's next offset as stored under offsets/.
func FormatOffset(next int64) string { return strconv.FormatInt(next, 10) }

// ParseOffset parses a stored next offset: a canonical non-negative decimal.
func ParseOffset(v []byte) (int64, error) {
	s := string(v)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != s {
		return 0, fmt.Errorf("%w: offset %q is not a canonical non-negative decimal", ErrMalformedValue, s)
	}
	return n, nil
}

// IngestersPrefix is the prefix of every live ingester's key.
func (k Keyspace) IngestersPrefix() string { return k.prefix + sectionIngesters }

// IngesterKey is the key of a live ingester: ingesters/{id}, held by the
// ingester's session lease.
func (k Keyspace) IngesterKey(id string) string {
	return k.prefix + sectionIngesters + escape(id)
}

// ParseIngesterKey parses an ingester key strictly and returns the id.
func (k Keyspace) ParseIngesterKey(key string) (string, error) {
	rest, err := k.cut(key, sectionIngesters)
	if err != nil {
		return "", err
	}
	if _, err := split(key, rest, 1); err != nil {
		return "", err
	}
	return unescape("ingester id", rest)
}

// MembersPrefix is the prefix of the member keys of partition p: one key
// per endpoint whose record names p, so a new owner of p reads its
// endpoints without reading every endpoint record of the keyspace.
func (k Keyspace) MembersPrefix(p Partition) string {
	return k.prefix + sectionMembers + escape(p.Topic) + "/" + strconv.FormatInt(int64(p.Partition), 10) + "/"
}

// MemberKey is the key that lists ep among partition p's endpoints:
// members/{topic}/{partition}/{model}/{pod}/{rank}. Its value is empty; it
// is written with the endpoint's record, on the record's lease, and deleted
// with it.
func (k Keyspace) MemberKey(p Partition, ep Endpoint) string {
	return string(appendEndpoint([]byte(k.MembersPrefix(p)), ep))
}

// ParseMemberKey parses a member key strictly.
func (k Keyspace) ParseMemberKey(key string) (Partition, Endpoint, error) {
	rest, err := k.cut(key, sectionMembers)
	if err != nil {
		return Partition{}, Endpoint{}, err
	}
	topic, rest, ok1 := strings.Cut(rest, "/")
	part, path, ok2 := strings.Cut(rest, "/")
	if !ok1 || !ok2 {
		return Partition{}, Endpoint{}, fmt.Errorf("%w: %q has too few segments after its section", ErrMalformedKey, key)
	}
	t, err := unescape("topic", topic)
	if err != nil {
		return Partition{}, Endpoint{}, err
	}
	n, err := parseInt32("partition", part)
	if err != nil {
		return Partition{}, Endpoint{}, err
	}
	ep, err := k.parseEndpointPath(key, path)
	if err != nil {
		return Partition{}, Endpoint{}, err
	}
	return Partition{Topic: t, Partition: n}, ep, nil
}
