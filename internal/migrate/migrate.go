package migrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
)

// maxAttempts bounds the runs started over because a lease expired while
// one ran.
const maxAttempts = 5

// attemptBackoff is the wait before the second attempt, doubling for each
// later one (0.5 + 1 + 2 + 4 s at most in all): time for etcd to revoke
// the lease that expired and delete its keys.
const attemptBackoff = 500 * time.Millisecond

// Run migrates cfg.From to cfg.To (or, with DryRun, computes it) and
// returns what it did. It returns ErrInvalidConfig, ErrIngesterAlive
// (before any write, or from a transaction's guard: what was written
// stays, and a later run finishes it), ErrV2Ahead, ErrTxnTooBig, or the
// etcd client's error; the report is non-nil whenever reading started.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var rep *Report
	var err error
	wait := attemptBackoff
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		m := &migration{cfg: &cfg, from: cfg.from(), to: cfg.to(), log: log, rep: newReport(&cfg)}
		m.rep.Attempts = attempt
		rep, err = m.run(ctx)
		if !errors.Is(err, errLeaseGone) || attempt == maxAttempts {
			return rep, err
		}
		// etcd revokes an expired lease, and deletes its keys, a moment
		// after it expires: read again once it has, not at once.
		log.Warn("a lease expired during the migration; reading again", "attempt", attempt, "err", err, "after", wait)
		select {
		case <-ctx.Done():
			return rep, ctx.Err()
		case <-time.After(wait):
		}
		wait *= 2
	}
	return rep, err
}

// migration is one attempt.
type migration struct {
	cfg      *Config
	from, to keyspace.Keyspace
	log      *slog.Logger
	rep      *Report
	r        *reader
	b        *batcher
	// endpoints holds the converted endpoints.
	endpoints map[keyspace.Endpoint]bool
	// v1Blocks counts the v1 block keys accounted for (converted or
	// skipped with their endpoint).
	v1Blocks int64
	// v2Chunks counts the v2 chunk keys read under some endpoint.
	v2Chunks int64
	// ttls caches the remaining TTL of the leases checked.
	ttls map[clientv3.LeaseID]int64
}

func (m *migration) skip(reason, key string, err error) {
	m.rep.Skipped[reason]++
	m.log.Warn("key not migrated", "reason", reason, "key", key, "err", err)
}

func (m *migration) run(ctx context.Context) (*Report, error) {
	cli := m.cfg.Etcd
	// The ingester check is the read that fixes the revision.
	var alive []string
	var rev int64
	for _, ks := range []keyspace.Keyspace{m.from, m.to} {
		// Values too (they are small), not WithKeysOnly: etcd leaves a
		// keys-only answer's leases out, which ingesterDesc names.
		cctx, cancel := call(ctx, m.cfg.CallTimeout)
		resp, err := cli.Get(cctx, ks.IngestersPrefix(), clientv3.WithPrefix(), clientv3.WithLimit(10))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("migrate: reading %s: %w", ks.IngestersPrefix(), err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			alive = append(alive, m.ingesterDesc(ctx, kv))
		}
	}
	if len(alive) > 0 {
		return nil, fmt.Errorf("%w: %s; stop every ingester (v1 and v2) first", ErrIngesterAlive, strings.Join(alive, ", "))
	}
	m.rep.Revision = rev
	m.r = &reader{kv: cli, rev: rev, page: m.cfg.PageSize, timeout: m.cfg.CallTimeout}
	m.b = &batcher{kv: cli, maxOps: m.cfg.MaxTxnOps, maxBytes: m.cfg.MaxTxnBytes, dry: m.cfg.DryRun, log: m.log, timeout: m.cfg.CallTimeout,
		guards: []clientv3.Cmp{noKeys(m.from.IngestersPrefix()), noKeys(m.to.IngestersPrefix())}}
	m.endpoints = map[keyspace.Endpoint]bool{}
	m.ttls = map[clientv3.LeaseID]int64{}
	// What was written stays written: a run that fails part way reports
	// the transactions etcd applied.
	defer func() { m.rep.Transactions, m.rep.Committed = m.b.txns, m.b.committed }()

	offsets, err := m.checkOffsets(ctx)
	if err != nil {
		return m.rep, err
	}
	// Records go before their chunks, chunks are deleted before their
	// records, and the offsets, written last, mark a finished migration.
	steps := []func(context.Context) error{
		m.convertEndpoints,
		m.dropGoneEndpoints,
		m.countOrphans,
		m.copyMembers,
		m.copyOwners,
		func(ctx context.Context) error {
			return m.copySection(ctx, m.from.OffsetsPrefix(), m.to.OffsetsPrefix(), offsets, &m.rep.Offsets, "bad_offset_key",
				func(key string) (string, error) {
					p, err := m.from.ParseOffsetKey(key)
					return m.to.OffsetKey(p), err
				})
		},
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return m.rep, err
		}
	}
	if err := m.b.flush(ctx); err != nil {
		return m.rep, err
	}
	m.rep.Puts, m.rep.Deletes, m.rep.Transactions = m.b.puts, m.b.deletes, m.b.txns
	return m.rep, nil
}

// noKeys is the guard "no key under prefix": with a range, etcd compares
// every key in it, and an empty range compares as one key that does not
// exist (create revision 0).
func noKeys(prefix string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(prefix), "=", 0).WithPrefix()
}

// ingesterDesc names a live ingester's key with its lease's remaining TTL.
func (m *migration) ingesterDesc(ctx context.Context, kv *mvccpb.KeyValue) string {
	desc := strconv.Quote(string(kv.Key))
	if kv.Lease == 0 {
		return desc + " (on no lease)"
	}
	ctx, cancel := call(ctx, m.cfg.CallTimeout)
	defer cancel()
	if resp, err := m.cfg.Etcd.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil {
		desc += fmt.Sprintf(" (lease %x, %ds left)", kv.Lease, resp.TTL)
	}
	return desc
}

// checkOffsets refuses a v2 keyspace that a v2 ingester wrote to: a v2
// offset past v1's, or one v1 does not have. It returns the v1 offsets'
// section as read, for copySection.
func (m *migration) checkOffsets(ctx context.Context) (map[string]*mvccpb.KeyValue, error) {
	v1 := map[string]*mvccpb.KeyValue{}
	if err := m.r.prefix(ctx, m.from.OffsetsPrefix(), false, func(kv *mvccpb.KeyValue) error {
		v1[strings.TrimPrefix(string(kv.Key), m.from.OffsetsPrefix())] = kv
		return nil
	}); err != nil {
		return nil, fmt.Errorf("migrate: reading %s: %w", m.from.OffsetsPrefix(), err)
	}
	err := m.r.prefix(ctx, m.to.OffsetsPrefix(), false, func(kv *mvccpb.KeyValue) error {
		name := strings.TrimPrefix(string(kv.Key), m.to.OffsetsPrefix())
		if old, ok := v1[name]; ok && bytes.Equal(old.Value, kv.Value) {
			return nil // as migrate copies it, malformed or not
		}
		v2, err := keyspace.ParseOffset(kv.Value)
		if err != nil {
			return fmt.Errorf("%w: v2 offset %q is %q, not one migrate wrote (delete the v2 prefix to migrate again): %v", ErrV2Ahead, kv.Key, kv.Value, err)
		}
		old, ok := v1[name]
		if !ok {
			return fmt.Errorf("%w: v2 offset %q = %d has no v1 offset (delete the v2 prefix to migrate again)", ErrV2Ahead, kv.Key, v2)
		}
		if v, err := keyspace.ParseOffset(old.Value); err == nil && v2 > v {
			return fmt.Errorf("%w: v2 offset %q = %d is past v1's %d: a v2 ingester has run (delete the v2 prefix to migrate again)", ErrV2Ahead, kv.Key, v2, v)
		}
		return nil
	})
	return v1, err
}

// leaseTTL returns id's remaining TTL, or errLeaseGone when it expired.
func (m *migration) leaseTTL(ctx context.Context, id clientv3.LeaseID) error {
	if id == 0 {
		return nil
	}
	ttl, ok := m.ttls[id]
	if !ok {
		cctx, cancel := call(ctx, m.cfg.CallTimeout)
		resp, err := m.cfg.Etcd.TimeToLive(cctx, id)
		cancel()
		if err != nil {
			return fmt.Errorf("migrate: lease %x: %w", int64(id), err)
		}
		ttl = resp.TTL
		m.ttls[id] = ttl
	}
	if ttl < 0 {
		// -1: expired (or revoked). 0 is a live lease with under a
		// second left: etcd rounds the remaining TTL down.
		return fmt.Errorf("%w: lease %x", errLeaseGone, int64(id))
	}
	if m.rep.MinLeaseTTL < 0 || ttl < m.rep.MinLeaseTTL {
		m.rep.MinLeaseTTL = ttl
	}
	return nil
}

// want writes key = value on lease unless current (the v2 key as read,
// nil when absent) already is that.
func (m *migration) want(ctx context.Context, current *mvccpb.KeyValue, key string, value []byte, lease int64) error {
	if current != nil && bytes.Equal(current.Value, value) && current.Lease == lease {
		m.rep.Unchanged++
		return nil
	}
	return m.b.put(ctx, key, string(value), clientv3.LeaseID(lease))
}

// copySection makes the v2 section toPrefix hold v1's section fromPrefix
// key for key (rename maps a v1 key to its v2 key), values and leases as
// they are, deleting v2 keys v1 does not have. v1 is the v1 section
// when already read (nil: read it).
func (m *migration) copySection(ctx context.Context, fromPrefix, toPrefix string, v1 map[string]*mvccpb.KeyValue, n *int, badReason string, rename func(string) (string, error)) error {
	if v1 == nil {
		v1 = map[string]*mvccpb.KeyValue{}
		if err := m.r.prefix(ctx, fromPrefix, false, func(kv *mvccpb.KeyValue) error {
			v1[strings.TrimPrefix(string(kv.Key), fromPrefix)] = kv
			return nil
		}); err != nil {
			return fmt.Errorf("migrate: reading %s: %w", fromPrefix, err)
		}
	}
	v2 := map[string]*mvccpb.KeyValue{}
	if err := m.r.prefix(ctx, toPrefix, false, func(kv *mvccpb.KeyValue) error {
		v2[string(kv.Key)] = kv
		return nil
	}); err != nil {
		return fmt.Errorf("migrate: reading %s: %w", toPrefix, err)
	}
	keep := map[string]bool{}
	for _, kv := range sortedKVs(v1) {
		key, err := rename(string(kv.Key))
		if err != nil {
			m.skip(badReason, string(kv.Key), err)
			continue
		}
		keep[key] = true
		*n++
		if err := m.want(ctx, v2[key], key, kv.Value, kv.Lease); err != nil {
			return err
		}
	}
	return m.deleteExtra(ctx, v2, keep)
}

// deleteExtra deletes the keys of v2 that keep lacks, in key order.
func (m *migration) deleteExtra(ctx context.Context, v2 map[string]*mvccpb.KeyValue, keep map[string]bool) error {
	for _, kv := range sortedKVs(v2) {
		if !keep[string(kv.Key)] {
			if err := m.b.del(ctx, string(kv.Key)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *migration) copyOwners(ctx context.Context) error {
	return m.copySection(ctx, m.from.Prefix()+"owners/", m.to.Prefix()+"owners/", nil, &m.rep.Owners, "bad_owner_key",
		func(key string) (string, error) {
			p, err := m.from.ParseOwnerKey(key)
			return m.to.OwnerKey(p), err
		})
}

// copyMembers copies the member keys of the converted endpoints.
func (m *migration) copyMembers(ctx context.Context) error {
	fromPrefix, toPrefix := m.from.Prefix()+"members/", m.to.Prefix()+"members/"
	v2 := map[string]*mvccpb.KeyValue{}
	if err := m.r.prefix(ctx, toPrefix, false, func(kv *mvccpb.KeyValue) error {
		v2[string(kv.Key)] = kv
		return nil
	}); err != nil {
		return fmt.Errorf("migrate: reading %s: %w", toPrefix, err)
	}
	keep := map[string]bool{}
	err := m.r.prefix(ctx, fromPrefix, false, func(kv *mvccpb.KeyValue) error {
		p, ep, err := m.from.ParseMemberKey(string(kv.Key))
		if err != nil {
			m.skip("bad_member_key", string(kv.Key), err)
			return nil
		}
		if !m.endpoints[ep] {
			m.skip("member_without_endpoint", string(kv.Key), nil)
			return nil
		}
		key := m.to.MemberKey(p, ep)
		keep[key] = true
		m.rep.Members++
		return m.want(ctx, v2[key], key, kv.Value, kv.Lease)
	})
	if err != nil {
		return fmt.Errorf("migrate: members: %w", err)
	}
	return m.deleteExtra(ctx, v2, keep)
}

// v2Record is the v1 record value rewritten for v2: tier_leases and
// chunk_next replaced, every other field kept byte for byte (the record
// is decoded as a JSON object, so fields this package does not know
// survive).
func v2Record(v1 []byte, shards map[string][]keyspace.LeaseShard, next map[string]uint64) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(v1, &obj); err != nil {
		return nil, fmt.Errorf("%w: endpoint record: %v", keyspace.ErrMalformedValue, err)
	}
	if obj == nil { // JSON null
		return nil, fmt.Errorf("%w: endpoint record is null, want an object", keyspace.ErrMalformedValue)
	}
	set := func(name string, v any, empty bool) error {
		if empty {
			delete(obj, name)
			return nil
		}
		b, err := json.Marshal(v)
		obj[name] = b
		return err
	}
	if err := set("tier_leases", shards, len(shards) == 0); err != nil {
		return nil, err
	}
	if err := set("chunk_next", next, len(next) == 0); err != nil {
		return nil, err
	}
	return json.Marshal(obj)
}
