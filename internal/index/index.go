package index

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// Index is the in-memory image of kvindex's etcd keyspace at one revision:
// per model, block hash -> the endpoints holding the block and their tiers;
// the endpoints with their records and per-tier block counts; and the
// partitions' applied next offsets.
//
// Layout (DESIGN "Reads", goal 48 bytes per (block, endpoint, tier)):
// endpoints are interned to small integer IDs; each model has one
// blockMap (blockmap.go) from block hash to a slot value that holds a single
// endpoint and its tier mask inline, or the offset of a sorted endpoint set
// in a pointer-free arena (setArena) for blocks several endpoints hold. A
// (block, endpoint) held in several tiers costs nothing extra, and no
// chunk state is kept (chunks.go).
//
// Concurrency: one writer (indexd's reflector) mutates it inside Write,
// one whole etcd revision at a time, so readers (Lookup, ListEndpoints,
// Lagging, Stats, Revision), who take the read lock, never see half a
// revision. An index that is still being built by a list is not shared yet
// and may be changed without Write.
type Index struct {
	ks keyspace.Keyspace

	mu       sync.RWMutex
	revision int64
	// offsets are the applied next offsets per partition, sorted by
	// (topic, partition).
	offsets    []PartitionOffset
	tables     map[string]*table
	eps        []endpoint
	freeIDs    []uint32
	byPrefix   map[string]uint32
	byEndpoint map[keyspace.Endpoint]uint32
	sets       setArena
	entries    uint64
	// dups counts, per (endpoint, tier, key hash) that more than one
	// chunk holds, the holders beyond the first (chunks.go); empty while
	// the writer keeps its rule, and between the events of a revision
	// that moves a key from one chunk to another.
	dups map[dupKey]uint32
	// keysA and keysB are putChunk's sort buffers.
	keysA, keysB []uint64
	// touched keeps diffChunk's touching loads live.
	touched uint32
}

// table is one model's blocks.
type table struct {
	blocks blockMap
	// endpoints counts the model's interned endpoints; the table goes when
	// the last one does.
	endpoints int
	// tokenBySize holds, per block size, the sorted IDs of the model's
	// endpoints whose record says token mode with that (non-zero) block
	// size: the endpoints a token Lookup without candidates keys for.
	tokenBySize map[uint32][]uint32
}

// endpoint is one interned endpoint; a zero value (used false) is a free
// ID.
type endpoint struct {
	ep     keyspace.Endpoint
	prefix string // keyspace EndpointChunksPrefix, the fast-path key
	tbl    *table
	blocks [tier.Count]uint64
	// record says the endpoints/ record exists; meta is decoded from it.
	record bool
	meta   endpointMeta
	used   bool
}

type endpointMeta struct {
	lastSeen  time.Time
	blockSize uint32
	partition int32
	// mode is the record's hash mode; empty when it did not decode.
	mode keyspace.HashMode
}

// tokenSize is the block size a token Lookup keys e at: its record's block
// size when the record says token mode, else 0 (a token Lookup skips it).
func (e *endpoint) tokenSize() uint32 {
	if !e.record || e.meta.mode != keyspace.HashModeToken {
		return 0
	}
	return e.meta.blockSize
}

// PartitionOffset is a partition's applied next offset: every record below
// Next is reflected in the index. Lagging reuses it for a barrier record,
// with the record's offset in Next.
type PartitionOffset struct {
	Partition keyspace.Partition
	Next      int64
}

// Match is one endpoint's share of a looked-up prefix (DESIGN semantics 5):
// Blocks leading hashes are present on Endpoint in some tier, and Tiers[i]
// is the best tier of block i. BlockSize is the endpoint's block size in
// tokens as its record states it (0 without a record or a size); a token
// Lookup keyed the prompt at exactly this size for this endpoint.
type Match struct {
	Endpoint  keyspace.Endpoint
	Blocks    int
	Tiers     []tier.Tier
	BlockSize uint32
}

// EndpointInfo is an endpoint as ListEndpoints reports it (the API's
// EndpointInfo).
type EndpointInfo struct {
	Endpoint keyspace.Endpoint
	// Blocks counts the endpoint's blocks per tier, indexed by tier-1.
	Blocks [tier.Count]uint64
	// Record says the endpoint has an endpoints/ record; the fields below
	// come from it and are zero without one.
	Record    bool
	LastSeen  time.Time
	BlockSize uint32
	Partition int32
	// HashMode is the record's hash mode (keyspace.HashModeEngine for a
	// record written before v1.1 names none); empty without a record or
	// with one that does not decode.
	HashMode keyspace.HashMode
}

// Stats are the index's sizes.
type Stats struct {
	// Entries counts present (block, endpoint, tier) triples.
	Entries uint64
	// Blocks counts distinct (model, block hash) keys.
	Blocks int
	// Endpoints counts interned endpoints.
	Endpoints int
	// Models counts models with at least one endpoint.
	Models int
	// SetWords is the arena's live words (4 bytes each).
	SetWords int
	// Duplicates counts the holds of an (endpoint, tier, key hash) by a
	// chunk beyond the first one holding it: 0 while the writer keeps
	// its rule (a key hash is in at most one chunk of an (endpoint,
	// tier)) and after every whole revision it writes.
	Duplicates int
}

// New returns an empty index for keys under ks at revision 0.
func New(ks keyspace.Keyspace) *Index {
	return &Index{
		ks:         ks,
		tables:     make(map[string]*table),
		byPrefix:   make(map[string]uint32),
		byEndpoint: make(map[keyspace.Endpoint]uint32),
	}
}

// Write runs fn, which applies the events of one etcd revision with
// ApplyPut, ApplyDelete or Put, in any order, under the write lock, and then raises the
// index's revision to rev (a lower rev leaves it): readers see all of the
// revision or none of it. fn must not call the index's read methods.
func (ix *Index) Write(rev int64, fn func()) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	fn()
	if ix.dups != nil && len(ix.dups) == 0 {
		ix.dups = nil // a move's transient holds are gone: let the map go
	}
	if rev > ix.revision {
		ix.revision = rev
	}
}

// Revision is the etcd revision the index reflects.
func (ix *Index) Revision() int64 {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.revision
}

// Stats returns the index's sizes.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s := Stats{Entries: ix.entries, Endpoints: len(ix.byPrefix), Models: len(ix.tables), SetWords: ix.sets.live}
	for _, n := range ix.dups {
		s.Duplicates += int(n)
	}
	for _, t := range ix.tables {
		s.Blocks += t.blocks.len()
	}
	return s
}

// ApplyPut applies a put of key with value, whose value before the put
// was prev (etcd's prev_kv; nil when the put created the key). It returns
// the key's kind and, for a key or value it cannot use, an error wrapping
// keyspace.ErrMalformedKey, ErrMalformedValue or ErrFull; the caller
// counts and logs it. owners/, ingesters/ and members/ keys are not
// indexed, and prev matters only for chunks/ keys.
//
// A chunk put is applied as the difference between prev and value (see
// chunks.go): the keys prev holds and value does not are removed, the
// ones value holds and prev does not are added. A value that does not
// parse counts as a chunk holding nothing (its old entries go, and the
// error says why); a prev that does not parse counts as nothing too, as
// it did when it arrived. A malformed endpoint record still marks its
// endpoint as recorded. Call it inside Write (or on an index not shared
// yet).
func (ix *Index) ApplyPut(key string, prev, value []byte) (keyspace.Kind, error) {
	kind := ix.ks.KindOf(key)
	switch kind {
	case keyspace.KindChunk:
		return kind, ix.putChunk(key, prev, value)
	case keyspace.KindEndpoint:
		return kind, ix.putEndpoint(key, value)
	case keyspace.KindOffset:
		return kind, ix.putOffset(key, value)
	case keyspace.KindOwner, keyspace.KindIngester, keyspace.KindMember:
		return kind, nil
	case keyspace.KindBlock:
		return kind, errV1Block(key)
	}
	return kind, fmt.Errorf("%w: %q is in no known section", keyspace.ErrMalformedKey, key)
}

// ApplyDelete applies a delete of key, whose value until then was prev
// (etcd's prev_kv), with ApplyPut's contract: a chunk delete removes every
// key prev holds. Deleting something absent is a no-op.
func (ix *Index) ApplyDelete(key string, prev []byte) (keyspace.Kind, error) {
	kind := ix.ks.KindOf(key)
	switch kind {
	case keyspace.KindChunk:
		return kind, ix.deleteChunk(key, prev)
	case keyspace.KindEndpoint:
		return kind, ix.deleteEndpoint(key)
	case keyspace.KindOffset:
		return kind, ix.deleteOffset(key)
	case keyspace.KindOwner, keyspace.KindIngester, keyspace.KindMember:
		return kind, nil
	case keyspace.KindBlock:
		return kind, errV1Block(key)
	}
	return kind, fmt.Errorf("%w: %q is in no known section", keyspace.ErrMalformedKey, key)
}

// errV1Block is the error for a v1 block key: the reader reads chunks
// only (DESIGN "etcd keyspace (v2)"), so a blocks/ key under the prefix
// means a keyspace that was not migrated.
func errV1Block(key string) error {
	return fmt.Errorf("%w: %q is a v1 block key; indexd reads v2 chunks only: the keyspace was not migrated to v2", keyspace.ErrMalformedKey, key)
}

// Put makes (hash, ep, t) present without building or parsing a key: for
// building an index from known entries (the benchmarks in
// bench build millions). It is presence, not a chunk: a
// triple Put twice is present once, and it must not be mixed with chunk
// puts of the same (endpoint, tier). It errors for an invalid endpoint
// (keyspace.ErrMalformedKey) or tier, or with ErrFull. Call it inside
// Write (or on an index not shared yet).
func (ix *Index) Put(ep keyspace.Endpoint, t tier.Tier, hash uint64) error {
	if !t.Valid() {
		return fmt.Errorf("%w: tier %d", keyspace.ErrMalformedKey, t)
	}
	id, ok := ix.byEndpoint[ep]
	if !ok {
		if err := ep.Validate(); err != nil {
			return err
		}
		var err error
		if id, err = ix.intern(ep, ix.ks.EndpointChunksPrefix(ep)); err != nil {
			return err
		}
	}
	_, err := ix.addRef(id, t, hash)
	if err != nil {
		ix.maybeFree(id)
	}
	return err
}

// EndpointPrefixes returns the chunks/ key prefix (keyspace
// EndpointChunksPrefix) of every endpoint the index knows, unsorted: where
// a list cuts the chunks/ keyspace into one range per endpoint.
func (ix *Index) EndpointPrefixes() []string {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make([]string, 0, len(ix.byPrefix))
	for p := range ix.byPrefix {
		out = append(out, p)
	}
	return out
}

// putEndpoint records an endpoints/ record. A value that does not decode
// still marks the endpoint as recorded (it exists in etcd) and returns an
// error wrapping ErrMalformedValue.
func (ix *Index) putEndpoint(key string, value []byte) error {
	ep, err := ix.ks.ParseEndpointKey(key)
	if err != nil {
		return err
	}
	id, ok := ix.byEndpoint[ep]
	if !ok {
		if id, err = ix.intern(ep, ix.ks.EndpointChunksPrefix(ep)); err != nil {
			return err
		}
	}
	e := &ix.eps[id]
	before := e.tokenSize()
	defer func() { ix.retoken(id, before) }()
	e.record = true
	rec, err := keyspace.UnmarshalEndpointMeta(value)
	if err != nil {
		e.meta = endpointMeta{}
		return fmt.Errorf("%w: %s: %w", ErrMalformedValue, key, err)
	}
	e.meta = endpointMeta{lastSeen: rec.LastRecord, blockSize: rec.BlockSize, partition: rec.Partition, mode: rec.HashMode}
	return nil
}

// retoken moves endpoint id between its table's token-mode size lists
// after its record changed; before is its tokenSize until then.
func (ix *Index) retoken(id uint32, before uint32) {
	e := &ix.eps[id]
	after := e.tokenSize()
	if after == before {
		return
	}
	t := e.tbl
	if before != 0 {
		ids := t.tokenBySize[before]
		if i, ok := slices.BinarySearch(ids, id); ok {
			ids = slices.Delete(ids, i, i+1)
		}
		if len(ids) == 0 {
			delete(t.tokenBySize, before)
		} else {
			t.tokenBySize[before] = ids
		}
	}
	if after != 0 {
		if t.tokenBySize == nil {
			t.tokenBySize = make(map[uint32][]uint32)
		}
		ids := t.tokenBySize[after]
		if i, ok := slices.BinarySearch(ids, id); !ok {
			t.tokenBySize[after] = slices.Insert(ids, i, id)
		}
	}
}

// deleteEndpoint forgets an endpoints/ record. It drops no block: blocks
// go with their chunks' keys.
func (ix *Index) deleteEndpoint(key string) error {
	ep, err := ix.ks.ParseEndpointKey(key)
	if err != nil {
		return err
	}
	id, ok := ix.byEndpoint[ep]
	if !ok {
		return nil
	}
	e := &ix.eps[id]
	before := e.tokenSize()
	e.record, e.meta = false, endpointMeta{}
	ix.retoken(id, before)
	ix.maybeFree(id)
	return nil
}

// putOffset records a partition's next offset. A value that does not
// parse drops the offset the partition had, as a list that meets it keeps
// none: etcd no longer holds that offset, and a barrier must not be met
// by it (the index never keeps a guess).
func (ix *Index) putOffset(key string, value []byte) error {
	p, err := ix.ks.ParseOffsetKey(key)
	if err != nil {
		return err
	}
	next, err := keyspace.ParseOffset(value)
	if err != nil {
		if i, ok := ix.findOffset(p); ok {
			ix.offsets = slices.Delete(ix.offsets, i, i+1)
		}
		return fmt.Errorf("%w: %s: %w", ErrMalformedValue, key, err)
	}
	i, ok := ix.findOffset(p)
	if ok {
		ix.offsets[i].Next = next
		return nil
	}
	p.Topic = strings.Clone(p.Topic)
	ix.offsets = slices.Insert(ix.offsets, i, PartitionOffset{Partition: p, Next: next})
	return nil
}

// deleteOffset forgets a partition's offset.
func (ix *Index) deleteOffset(key string) error {
	p, err := ix.ks.ParseOffsetKey(key)
	if err != nil {
		return err
	}
	if i, ok := ix.findOffset(p); ok {
		ix.offsets = slices.Delete(ix.offsets, i, i+1)
	}
	return nil
}

func comparePartitions(a, b keyspace.Partition) int {
	if c := strings.Compare(a.Topic, b.Topic); c != 0 {
		return c
	}
	return cmp.Compare(a.Partition, b.Partition)
}

func (ix *Index) findOffset(p keyspace.Partition) (int, bool) {
	return slices.BinarySearchFunc(ix.offsets, p, func(o PartitionOffset, p keyspace.Partition) int {
		return comparePartitions(o.Partition, p)
	})
}

// intern gives ep (whose blocks prefix is prefix) an endpoint ID. The
// strings are cloned: callers may pass views of etcd's response buffers.
func (ix *Index) intern(ep keyspace.Endpoint, prefix string) (uint32, error) {
	var id uint32
	if n := len(ix.freeIDs); n > 0 {
		id = ix.freeIDs[n-1]
		ix.freeIDs = ix.freeIDs[:n-1]
	} else {
		if len(ix.eps) > int(maxEndpointID) {
			return 0, fmt.Errorf("%w: more than %d endpoints", ErrFull, maxEndpointID+1)
		}
		id = uint32(len(ix.eps))
		ix.eps = append(ix.eps, endpoint{})
	}
	ep = keyspace.Endpoint{Model: strings.Clone(ep.Model), Pod: strings.Clone(ep.Pod), Rank: ep.Rank}
	tbl := ix.tables[ep.Model]
	if tbl == nil {
		tbl = &table{}
		ix.tables[ep.Model] = tbl
	}
	tbl.endpoints++
	e := endpoint{ep: ep, prefix: strings.Clone(prefix), tbl: tbl, used: true}
	ix.eps[id] = e
	ix.byPrefix[e.prefix] = id
	ix.byEndpoint[ep] = id
	return id, nil
}

// maybeFree releases the ID of an endpoint with no record and no block.
func (ix *Index) maybeFree(id uint32) {
	e := &ix.eps[id]
	if e.record || e.blocks != [tier.Count]uint64{} {
		return
	}
	delete(ix.byPrefix, e.prefix)
	delete(ix.byEndpoint, e.ep)
	if e.tbl.endpoints--; e.tbl.endpoints == 0 {
		delete(ix.tables, e.ep.Model)
	}
	*e = endpoint{}
	ix.freeIDs = append(ix.freeIDs, id)
}

// Scratch holds a Lookup's working memory and result; the zero value is
// ready. Reused across calls (indexd pools them), a Lookup allocates
// nothing in steady state. Matches' Tiers alias the scratch: copy before
// reusing it. Not safe for concurrent use.
type Scratch struct {
	vals  []uint32 // slot values of a chunk of probed blocks
	alive []uint32 // endpoint IDs still matching, sorted
	// col holds, block after block, the best tier of each endpoint still
	// alive after that block, in alive (endpoint ID) order.
	col   []tier.Tier
	done  []doneMatch
	cands []uint32
	tiers []tier.Tier
	order []int32 // indexes into done in answer order
	touch uint32
	// A token Lookup's endpoints per block size (groupIDs[g.from:g.to]
	// for group g) and its keys per block size.
	groups   []sizeGroup
	groupIDs []uint32
	sized    []sizedKeys

	// Results.
	Matches  []Match
	Revision int64
	Offsets  []PartitionOffset
	// LeftOut is, after LookupTokens, the endpoints it left out because
	// their block size was not among the MaxTokenBlockSizes it keyed at;
	// LeftOutSizes is how many sizes that was (both 0 after Lookup).
	LeftOut, LeftOutSizes int
}

// probeChunk is how many hashes Lookup probes before intersecting them:
// enough for the memory accesses of independent probes to overlap (as in a
// bare probe loop), few enough that a prefix that stops matching early
// wastes little.
const probeChunk = 16

// sizeGroup is the endpoints a token Lookup keys at one block size.
type sizeGroup struct {
	size     uint32
	from, to int
}

// sizedKeys is a token prompt's keys at one block size.
type sizedKeys struct {
	size uint32
	keys []uint64
}

type doneMatch struct {
	id     uint32
	blocks int
	out    int // offset of its tiers in Scratch.tiers
}

// Lookup answers DESIGN semantics 5 for model and hashes into sc: per
// endpoint, the longest run of leading hashes present in some tier and the
// best tier of each; endpoints with no leading block are left out. When
// candidates is non-nil, only those endpoints (Model ignored: the model is
// model) are considered; unknown candidates match nothing. sc.Matches come
// out ordered by blocks descending, then pod, then rank, and sc.Revision
// and sc.Offsets name the state that answered. Every endpoint is
// considered, whatever its hash mode.
func (ix *Index) Lookup(sc *Scratch, model string, hashes []uint64, candidates []keyspace.Endpoint) {
	ix.mu.RLock()
	ix.beginLocked(sc)
	if tbl := ix.tables[model]; tbl != nil {
		var cands []uint32
		if candidates != nil {
			cands = ix.candidateIDs(sc, model, candidates)
		}
		ix.lookupLocked(sc, tbl, hashes, cands, candidates != nil)
	}
	ix.mu.RUnlock()
}

// beginLocked starts an answer: the state's revision and offsets, no
// matches yet.
func (ix *Index) beginLocked(sc *Scratch) {
	sc.Revision = ix.revision
	sc.Offsets = append(sc.Offsets[:0], ix.offsets...)
	sc.Matches, sc.tiers = sc.Matches[:0], sc.tiers[:0]
}

// candidateIDs returns the sorted IDs of the known candidates of model.
func (ix *Index) candidateIDs(sc *Scratch, model string, candidates []keyspace.Endpoint) []uint32 {
	cands := sc.cands[:0]
	for _, c := range candidates {
		c.Model = model
		if id, ok := ix.byEndpoint[c]; ok {
			cands = append(cands, id)
		}
	}
	slices.Sort(cands)
	sc.cands = cands
	return cands
}

// MaxTokenBlockSizes is the most distinct block sizes one token Lookup
// keys its prompt at (DESIGN "Hashing"); past it LookupTokens keeps the
// sizes whose endpoints hold the most blocks.
const MaxTokenBlockSizes = 4

// Keyer appends a token prompt's block keys at blockSize tokens per block
// to dst and returns it (client.AppendTokenKeys over the request's
// prompt). It must be safe to call while the index is read-locked.
type Keyer func(dst []uint64, blockSize int) []uint64

// LookupTokens answers a token Lookup (DESIGN "Hashing", readers): the
// endpoints of model in token hash mode with a known block size (only
// those among candidates when candidates is non-nil) are grouped by block
// size; the prompt is keyed once per size with keys, and each group is
// looked up with its own keys as Lookup does. Every match carries the
// block size it was keyed at; sc.Matches come out in Lookup's order across
// all groups.
//
// When those endpoints have more than MaxTokenBlockSizes sizes, only the
// MaxTokenBlockSizes sizes whose endpoints hold the most blocks (all
// tiers; the smaller size on a tie) are keyed, and the endpoints of the
// others are left out of the answer, counted in sc.LeftOut and
// sc.LeftOutSizes. An endpoint that reports an odd block size then hides
// only itself, not every endpoint of its model.
//
// Keys are computed before the read lock is taken, for the sizes the
// endpoints have then; a size that appears between that and the answer's
// state is keyed under the lock.
func (ix *Index) LookupTokens(sc *Scratch, model string, keys Keyer, candidates []keyspace.Endpoint) {
	sc.sized = sc.sized[:0]
	ix.mu.RLock()
	ix.tokenGroupsLocked(sc, model, candidates)
	ix.mu.RUnlock()
	for _, g := range sc.groups {
		sc.keysFor(g.size, keys)
	}

	ix.mu.RLock()
	defer ix.mu.RUnlock()
	ix.beginLocked(sc)
	ix.tokenGroupsLocked(sc, model, candidates)
	tbl := ix.tables[model]
	for _, g := range sc.groups {
		ix.lookupLocked(sc, tbl, sc.keysFor(g.size, keys), sc.groupIDs[g.from:g.to], true)
	}
	if len(sc.groups) > 1 {
		// Each group's matches are in order; merge them into one.
		slices.SortStableFunc(sc.Matches, compareMatches)
	}
}

// compareMatches is the answer's order: blocks descending, then pod, then
// rank.
func compareMatches(a, b Match) int {
	if c := cmp.Compare(b.Blocks, a.Blocks); c != 0 {
		return c
	}
	if c := strings.Compare(a.Endpoint.Pod, b.Endpoint.Pod); c != 0 {
		return c
	}
	return cmp.Compare(a.Endpoint.Rank, b.Endpoint.Rank)
}

// keysFor returns the prompt's keys at size, computing them with keys the
// first time this call asks for the size.
func (sc *Scratch) keysFor(size uint32, keys Keyer) []uint64 {
	for i := range sc.sized {
		if sc.sized[i].size == size {
			return sc.sized[i].keys
		}
	}
	n := len(sc.sized)
	if n < cap(sc.sized) {
		sc.sized = sc.sized[:n+1]
	} else {
		sc.sized = append(sc.sized, sizedKeys{})
	}
	e := &sc.sized[n]
	e.size, e.keys = size, keys(e.keys[:0], int(size))
	return e.keys
}

// tokenGroupsLocked fills sc.groups and sc.groupIDs with the token-mode
// endpoints of model (the known ones among candidates when it is non-nil)
// by block size, sizes ascending, IDs sorted in each group, at most
// MaxTokenBlockSizes groups (keepSizesLocked).
func (ix *Index) tokenGroupsLocked(sc *Scratch, model string, candidates []keyspace.Endpoint) {
	sc.groups, sc.groupIDs = sc.groups[:0], sc.groupIDs[:0]
	sc.LeftOut, sc.LeftOutSizes = 0, 0
	tbl := ix.tables[model]
	if tbl == nil {
		return
	}
	if candidates == nil {
		for size := range tbl.tokenBySize {
			sc.groups = append(sc.groups, sizeGroup{size: size})
		}
		slices.SortFunc(sc.groups, func(a, b sizeGroup) int { return cmp.Compare(a.size, b.size) })
		for i := range sc.groups {
			g := &sc.groups[i]
			g.from = len(sc.groupIDs)
			sc.groupIDs = append(sc.groupIDs, tbl.tokenBySize[g.size]...)
			g.to = len(sc.groupIDs)
		}
		ix.keepSizesLocked(sc)
		return
	}
	ids := sc.groupIDs[:0]
	for _, c := range candidates {
		c.Model = model
		id, ok := ix.byEndpoint[c]
		if !ok || ix.eps[id].tokenSize() == 0 {
			continue
		}
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b uint32) int {
		if c := cmp.Compare(ix.eps[a].tokenSize(), ix.eps[b].tokenSize()); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	ids = slices.Compact(ids)
	for i, id := range ids {
		size := ix.eps[id].tokenSize()
		if n := len(sc.groups); n == 0 || sc.groups[n-1].size != size {
			sc.groups = append(sc.groups, sizeGroup{size: size, from: i})
		}
		sc.groups[len(sc.groups)-1].to = i + 1
	}
	sc.groupIDs = ids
	ix.keepSizesLocked(sc)
}

// keepSizesLocked cuts sc.groups to the MaxTokenBlockSizes sizes whose
// endpoints hold the most blocks, the smaller size first on a tie, and
// counts the endpoints and sizes it drops in sc.LeftOut and
// sc.LeftOutSizes. The kept groups stay in size order; each keeps its
// IDs, moved down over the dropped groups'.
func (ix *Index) keepSizesLocked(sc *Scratch) {
	if len(sc.groups) <= MaxTokenBlockSizes {
		return
	}
	held := make([]uint64, len(sc.groups))
	for i, g := range sc.groups {
		for _, id := range sc.groupIDs[g.from:g.to] {
			for _, n := range ix.eps[id].blocks {
				held[i] += n
			}
		}
	}
	rank := make([]int, len(sc.groups))
	for i := range rank {
		rank[i] = i
	}
	slices.SortFunc(rank, func(a, b int) int {
		if c := cmp.Compare(held[b], held[a]); c != 0 {
			return c
		}
		return cmp.Compare(sc.groups[a].size, sc.groups[b].size)
	})
	keep := make([]bool, len(sc.groups))
	for _, i := range rank[:MaxTokenBlockSizes] {
		keep[i] = true
	}
	groups, ids := sc.groups[:0], sc.groupIDs[:0]
	for i, g := range sc.groups {
		if !keep[i] {
			sc.LeftOut += g.to - g.from
			sc.LeftOutSizes++
			continue
		}
		from := len(ids)
		ids = append(ids, sc.groupIDs[g.from:g.to]...) // never ahead of what it reads
		groups = append(groups, sizeGroup{size: g.size, from: from, to: len(ids)})
	}
	sc.groups, sc.groupIDs = groups, ids
}

// lookupLocked walks hashes in order keeping the sorted list of endpoints
// that still match every block so far, and stops as soon as it is empty.
// While walking it appends, per block, the best tier of each survivor to
// sc.col; the matches' tier lists are then read back from that column in
// one sequential pass. The matches are appended to sc.Matches (their
// tiers to sc.tiers), in the answer's order. With restrict, only the
// endpoints in cands (sorted IDs) are considered.
func (ix *Index) lookupLocked(sc *Scratch, tbl *table, hashes []uint64, cands []uint32, restrict bool) {
	sc.alive, sc.done, sc.col = sc.alive[:0], sc.done[:0], sc.col[:0]
	if tbl == nil || len(hashes) == 0 {
		return
	}
	m := &tbl.blocks
	v := m.get(mix(hashes[0]))
	if v == 0 {
		return
	}
	alive, col := ix.seed(sc, v, cands, restrict)
	if len(alive) == 0 {
		return
	}
	done, col := ix.walk(sc, m, hashes, alive, col)
	ix.assemble(sc, done, col)
}

// walk follows hashes[1:] from alive, the endpoints (sorted IDs) holding
// the first block, with col their best tiers of it. An endpoint leaves
// alive at the first block it lacks; walk stops when none is left. It
// returns done, one entry per endpoint with the number of blocks it
// matched, and col extended by, per block, the best tier of each endpoint
// still alive there, in ID order.
func (ix *Index) walk(sc *Scratch, m *blockMap, hashes []uint64, alive []uint32, col []tier.Tier) ([]doneMatch, []tier.Tier) {
	done := sc.done
	vals := sc.vals
	words := ix.sets.words
	i := 1
outer:
	for i < len(hashes) {
		// Probe a chunk of hashes, and touch the endpoint sets they
		// point to, in tight loops whose cache misses overlap.
		end := min(i+probeChunk, len(hashes))
		vals = vals[:0]
		var touch uint32
		for _, h := range hashes[i:end] {
			v := m.get(mix(h))
			vals = append(vals, v)
			if v&multiBit != 0 {
				touch += words[v&^multiBit]
			}
		}
		sc.touch += touch // keeps the touching loads alive
		for _, v := range vals {
			switch {
			case v == 0:
				for _, id := range alive {
					done = append(done, doneMatch{id: id, blocks: i})
				}
				alive = alive[:0]
			case v&multiBit == 0:
				// One endpoint holds the block: at most it survives.
				id := valueID(v)
				if len(alive) != 1 || alive[0] != id {
					keep := false
					for _, a := range alive {
						if a == id {
							keep = true
						} else {
							done = append(done, doneMatch{id: a, blocks: i})
						}
					}
					alive = alive[:0]
					if keep {
						alive = append(alive, id)
					}
				}
				if len(alive) == 1 {
					col = append(col, bestTier(valueMask(v)))
				}
			default:
				off := v &^ multiBit
				ms := words[off+1 : off+1+words[off]&lenMask]
				n, j := 0, 0
				for _, a := range alive {
					for j < len(ms) && valueID(ms[j]) < a {
						j++
					}
					if j < len(ms) && valueID(ms[j]) == a {
						alive[n] = a
						n++
						col = append(col, bestTier(valueMask(ms[j])))
					} else {
						done = append(done, doneMatch{id: a, blocks: i})
					}
				}
				alive = alive[:n]
			}
			if len(alive) == 0 {
				break outer
			}
			i++
		}
	}
	for _, id := range alive {
		done = append(done, doneMatch{id: id, blocks: i})
	}
	sc.vals, sc.alive, sc.col = vals, alive, col
	return done, col
}

// assemble turns walk's answer into the matches: it reads each match's
// tiers back from col in one sequential pass (col holds, for block b, one
// entry per endpoint with more than b blocks, in endpoint ID order) and
// appends the matches to sc.Matches, their tiers to sc.tiers, in the
// answer's order.
func (ix *Index) assemble(sc *Scratch, done []doneMatch, col []tier.Tier) {
	slices.SortFunc(done, func(a, b doneMatch) int { return cmp.Compare(a.id, b.id) })
	total := 0
	for k := range done {
		done[k].out = total
		total += done[k].blocks
	}
	base := len(sc.tiers)
	tiers := slices.Grow(sc.tiers, total)[:base+total]
	live := append(sc.alive[:0], make([]uint32, len(done))...) // indexes into done, reusing alive's memory
	for k := range live {
		live[k] = uint32(k)
	}
	pos := 0
	for b := 0; len(live) > 0; b++ {
		n := 0
		for _, k := range live {
			d := &done[k]
			tiers[base+d.out+b] = col[pos]
			pos++
			if d.blocks > b+1 {
				live[n] = k
				n++
			}
		}
		live = live[:n]
	}
	// The answer's order: blocks descending, then pod, then rank. Sorting
	// indexes into done, not the 72-byte matches, was a third of the
	// Lookup time of trace queries whose first block many endpoints hold
	// (BENCHMARKS.md, "Lookup").
	order := sc.order[:0]
	for k := range done {
		order = append(order, int32(k))
	}
	slices.SortFunc(order, func(a, b int32) int {
		da, db := &done[a], &done[b]
		if c := cmp.Compare(db.blocks, da.blocks); c != 0 {
			return c
		}
		ea, eb := &ix.eps[da.id].ep, &ix.eps[db.id].ep
		if c := strings.Compare(ea.Pod, eb.Pod); c != 0 {
			return c
		}
		return cmp.Compare(ea.Rank, eb.Rank)
	})
	matches := slices.Grow(sc.Matches, len(done))
	for _, k := range order {
		d := &done[k]
		e := &ix.eps[d.id]
		lo, hi := base+d.out, base+d.out+d.blocks
		matches = append(matches, Match{Endpoint: e.ep, Blocks: d.blocks, Tiers: tiers[lo:hi:hi], BlockSize: e.meta.blockSize})
	}
	sc.done, sc.alive, sc.tiers, sc.Matches, sc.order = done, live, tiers, matches, order
}

// seed returns the endpoints holding the first block (slot value v),
// restricted to cands (sorted IDs) with restrict, and sc.col with their
// best tiers of that block appended.
func (ix *Index) seed(sc *Scratch, v uint32, cands []uint32, restrict bool) ([]uint32, []tier.Tier) {
	alive, col := sc.alive[:0], sc.col[:0]
	add := func(m uint32) {
		id := valueID(m)
		if restrict {
			if _, ok := slices.BinarySearch(cands, id); !ok {
				return
			}
		}
		alive = append(alive, id)
		col = append(col, bestTier(valueMask(m)))
	}
	if v&multiBit == 0 {
		add(v)
	} else {
		for _, m := range ix.sets.members(v &^ multiBit) {
			add(m)
		}
	}
	return alive, col
}

// ListEndpoints returns the endpoints of model (every model when model is
// empty) ordered by model, pod, rank, and the revision that answered.
func (ix *Index) ListEndpoints(model string) ([]EndpointInfo, int64) {
	ix.mu.RLock()
	out := make([]EndpointInfo, 0, len(ix.byPrefix))
	for i := range ix.eps {
		e := &ix.eps[i]
		if !e.used || (model != "" && e.ep.Model != model) {
			continue
		}
		out = append(out, EndpointInfo{
			Endpoint: e.ep, Blocks: e.blocks, Record: e.record,
			LastSeen: e.meta.lastSeen, BlockSize: e.meta.blockSize, Partition: e.meta.partition, HashMode: e.meta.mode,
		})
	}
	rev := ix.revision
	ix.mu.RUnlock()
	slices.SortFunc(out, func(a, b EndpointInfo) int { return keyspace.CompareEndpoints(a.Endpoint, b.Endpoint) })
	return out, rev
}

// lagging returns the first barrier record whose partition's applied next
// offset is not yet past the record's offset, with that applied offset (-1
// when the partition is unknown); ok is true when every record is met.
func (ix *Index) Lagging(records []PartitionOffset) (rec PartitionOffset, applied int64, ok bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for _, r := range records {
		applied = -1
		if i, found := ix.findOffset(r.Partition); found {
			applied = ix.offsets[i].Next
		}
		if applied <= r.Next {
			return r, applied, false
		}
	}
	return PartitionOffset{}, 0, true
}
