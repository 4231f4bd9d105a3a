package gie

import (
	"context"
	"fmt"
	"time"
)

// EndpointMatch is one candidate endpoint's share of a prompt: the
// prompt's first Blocks blocks of BlockSize tokens are cached on it, out
// of Total full blocks. GPU, CPU and Disk split Blocks by the best tier
// holding each block (a block without a tier counts as GPU), so
// GPU+CPU+Disk is Blocks; Speculative counts the blocks known only from
// speculative entries (counted as GPU: they were just computed there).
type EndpointMatch struct {
	Blocks, Total, BlockSize int
	GPU, CPU, Disk           int
	Speculative              int
}

// MatcherConfig configures a Matcher.
type MatcherConfig struct {
	// BlockSize is the block size, in tokens, assumed for an endpoint the
	// index reports no match for, and the size the speculative entries
	// name blocks at. Default 16 (vLLM's default); must be positive.
	BlockSize int
	// LookupTimeout bounds one Lookup. Default 100 ms; must be positive.
	LookupTimeout time.Duration
	// MaxPromptTokens caps the tokens looked up: a longer prompt is looked
	// up by its first MaxPromptTokens tokens (a prefix match needs no
	// more), and Total counts only those. Default 65536; between 1 and
	// MaxMatcherPromptTokens. indexd refuses a token Lookup of more than
	// its --max-tokens (default 131,072) as invalid, and the producer
	// then falls back, so a value above indexd's wastes the Lookup.
	MaxPromptTokens int
	// MaxStaleness is the oldest an answer may be: Match refuses an
	// answer whose ProgressTime is more than MaxStaleness before the
	// Matcher's clock with an error wrapping ErrStale, which the producer
	// counts as a fallback (reason "stale"). An answer without a progress
	// time is not judged. Default DefaultMaxStaleness (30 s, indexd's
	// default --max-staleness); 0 turns the check off; not negative.
	MaxStaleness time.Duration
}

// MaxMatcherPromptTokens is the most MatcherConfig.MaxPromptTokens may be:
// 1 Mi tokens, 65,536 blocks of 16, 8× indexd's default --max-tokens. It
// bounds what one request may make the producer hash and send.
const MaxMatcherPromptTokens = 1 << 20

// DefaultMatcherConfig returns the defaults documented on MatcherConfig.
func DefaultMatcherConfig() MatcherConfig {
	return MatcherConfig{BlockSize: 16, LookupTimeout: 100 * time.Millisecond, MaxPromptTokens: 65536, MaxStaleness: DefaultMaxStaleness}
}

// Validate reports the first field out of range.
func (c MatcherConfig) Validate() error {
	switch {
	case c.BlockSize <= 0:
		return fmt.Errorf("%w: blockSize %d must be positive", ErrInvalidConfig, c.BlockSize)
	case c.BlockSize > MaxBlockSize:
		return fmt.Errorf("%w: blockSize %d: at most %d tokens (the client's MaxHasherBlockSize)", ErrInvalidConfig, c.BlockSize, MaxBlockSize)
	case c.LookupTimeout <= 0:
		return fmt.Errorf("%w: lookupTimeout %v must be positive", ErrInvalidConfig, c.LookupTimeout)
	case c.MaxPromptTokens <= 0 || c.MaxPromptTokens > MaxMatcherPromptTokens:
		return fmt.Errorf("%w: maxPromptTokens %d must be between 1 and %d", ErrInvalidConfig, c.MaxPromptTokens, MaxMatcherPromptTokens)
	case c.BlockSize > c.MaxPromptTokens:
		return fmt.Errorf("%w: blockSize %d is above maxPromptTokens %d: no prompt looked up would fill one block", ErrInvalidConfig, c.BlockSize, c.MaxPromptTokens)
	case c.MaxStaleness < 0:
		return fmt.Errorf("%w: maxStaleness %v must not be negative (0 turns the check off)", ErrInvalidConfig, c.MaxStaleness)
	}
	return nil
}

// Matcher is the router-independent core of the producer: a prompt's
// tokens → one Lookup → each candidate's EndpointMatch, merged with the
// speculative entries. It is safe for concurrent use.
type Matcher struct {
	cfg   MatcherConfig
	index Index
	spec  *Speculative
	// now is the clock answers' ages are taken by (time.Now).
	now func() time.Time
}

// NewMatcher returns a Matcher asking index, merging spec's entries (nil:
// none). It errors for an invalid cfg.
func NewMatcher(cfg MatcherConfig, index Index, spec *Speculative) (*Matcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if k, ok := index.(*KVIndex); index == nil || ok && k == nil {
		return nil, fmt.Errorf("%w: no index", ErrInvalidConfig)
	}
	return &Matcher{cfg: cfg, index: index, spec: spec, now: time.Now}, nil
}

// Match looks model's prompt up among candidates (every endpoint the
// index knows when empty) and returns an EndpointMatch for each candidate,
// zero blocks for those holding nothing. Speculative entries add blocks
// beyond the index's answer only until that answer has caught up with
// their decision (Speculative). The Lookup runs under
// LookupTimeout (or ctx's sooner deadline); its error is returned
// unchanged, with a nil map. An answer older than MaxStaleness is an
// error wrapping ErrStale, with a nil map.
func (m *Matcher) Match(ctx context.Context, model string, p Prompt, candidates []Identity) (map[Identity]EndpointMatch, error) {
	p = m.truncate(p)
	lctx, cancel := context.WithTimeout(ctx, m.cfg.LookupTimeout)
	defer cancel()
	ans, err := m.index.LookupTokens(lctx, model, p, candidates)
	if err != nil {
		return nil, err
	}
	if err := m.checkFresh(ans.ProgressTime); err != nil {
		return nil, err
	}
	var keys []uint64
	if m.spec != nil {
		keys = m.spec.Keys(model, p)
	}
	spec := func(id Identity) int {
		if len(keys) == 0 {
			return 0
		}
		return m.spec.Match(keys, id, ans.ProgressTime)
	}
	return merge(candidates, ans.Matches, spec, m.specBlockSize(), len(p.TokenIDs), m.cfg.BlockSize), nil
}

// checkFresh returns an error wrapping ErrStale when progress (an
// answer's ProgressTime) is more than MaxStaleness old; a zero progress
// (the replica did not say) or MaxStaleness 0 passes. The age compares
// indexd's clock with this process's, so a clock skew counts in it.
func (m *Matcher) checkFresh(progress time.Time) error {
	if m.cfg.MaxStaleness <= 0 || progress.IsZero() {
		return nil
	}
	if age := m.now().Sub(progress); age > m.cfg.MaxStaleness {
		return fmt.Errorf("%w: the answer's progress time %s is %v old, past maxStaleness %v",
			ErrStale, progress.UTC().Format(time.RFC3339Nano), age.Round(time.Millisecond), m.cfg.MaxStaleness)
	}
	return nil
}

// Remember records that model's prompt p was sent to id, for the
// speculative entries' TTL.
func (m *Matcher) Remember(model string, p Prompt, id Identity) {
	if m.spec == nil {
		return
	}
	m.spec.Remember(m.spec.Keys(model, m.truncate(p)), id)
}

func (m *Matcher) specBlockSize() int {
	if m.spec == nil {
		return m.cfg.BlockSize
	}
	return m.spec.BlockSize()
}

// promptTokens is how many of p's tokens a Match looks up: all, up to
// MaxPromptTokens.
func (m *Matcher) promptTokens(p Prompt) int { return min(len(p.TokenIDs), m.cfg.MaxPromptTokens) }

// truncate cuts p to MaxPromptTokens tokens, dropping the multimodal
// items that start past the cut.
func (m *Matcher) truncate(p Prompt) Prompt {
	if len(p.TokenIDs) <= m.cfg.MaxPromptTokens {
		return p
	}
	p.TokenIDs = p.TokenIDs[:m.cfg.MaxPromptTokens]
	var mm []MultiModalItem
	for _, it := range p.MultiModal {
		if it.Offset < m.cfg.MaxPromptTokens {
			mm = append(mm, it)
		}
	}
	p.MultiModal = mm
	return p
}

// merge builds each candidate's EndpointMatch from the index's matches
// and its speculative blocks (spec, counted in blocks of specBlockSize
// tokens), for a prompt of tokens tokens. A candidate the index does not
// report is taken to use defaultBlockSize. When candidates is empty, the
// endpoints the index reports are the candidates. An endpoint the answer
// names twice (indexd does not; a cell's answer merged with another's
// might) takes the entry holding more prompt tokens.
func merge(candidates []Identity, matches []IndexMatch, spec func(Identity) int, specBlockSize, tokens, defaultBlockSize int) map[Identity]EndpointMatch {
	byID := make(map[Identity]IndexMatch, len(matches))
	for _, im := range matches {
		if old, ok := byID[im.Identity]; ok && old.Blocks*max(old.BlockSize, 1) >= im.Blocks*max(im.BlockSize, 1) {
			continue
		}
		byID[im.Identity] = im
	}
	if len(candidates) == 0 {
		for _, im := range matches {
			candidates = append(candidates, im.Identity)
		}
	}
	out := make(map[Identity]EndpointMatch, len(candidates))
	for _, id := range candidates {
		im, ok := byID[id]
		bs := defaultBlockSize
		if ok && im.BlockSize > 0 {
			bs = im.BlockSize
		}
		em := EndpointMatch{BlockSize: bs, Total: tokens / bs}
		if ok {
			em.Blocks = min(im.Blocks, em.Total)
			for i := range em.Blocks {
				t := TierUnspecified
				if i < len(im.Tiers) {
					t = im.Tiers[i]
				}
				// A block the index names no tier for (an older index,
				// or an answer without tiers) is present all the same:
				// it counts as GPU, as PrefixCacheMatchInfo counts it,
				// so GPU+CPU+Disk is always Blocks and the tier scorer
				// never scores a match below the prefix scorer for want
				// of a tier.
				switch t {
				case TierCPU:
					em.CPU++
				case TierDisk:
					em.Disk++
				default:
					em.GPU++
				}
			}
		}
		// Speculative blocks, converted to whole blocks of this
		// endpoint's size.
		if s := min(spec(id)*specBlockSize/bs, em.Total); s > em.Blocks {
			em.Speculative = s - em.Blocks
			em.GPU += em.Speculative
			em.Blocks = s
		}
		out[id] = em
	}
	return out
}
