package migrate

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/kvindex/kvindex/internal/tier"
)

// Report is what a migration read, wrote (or, dry, would write) and
// skipped.
type Report struct {
	// From and To are the prefixes.
	From string `json:"from"`
	To   string `json:"to"`
	// Revision is the etcd revision both prefixes were read at.
	Revision int64 `json:"revision"`
	// DryRun says nothing was written.
	DryRun bool `json:"dry_run"`
	// Attempts is how many times the migration started: more than one
	// when a lease expired while it ran (each attempt reads again).
	Attempts int `json:"attempts"`
	// Endpoints is the endpoints converted; TokenEndpoints of them are in
	// token mode (chunk entries of 16 bytes).
	Endpoints      int `json:"endpoints"`
	TokenEndpoints int `json:"token_endpoints"`
	// Blocks and Chunks count the converted blocks and the chunks they
	// fill, by tier name.
	Blocks map[string]int `json:"blocks"`
	Chunks map[string]int `json:"chunks"`
	// Members, Offsets and Owners count the keys of those sections copied.
	Members int `json:"members"`
	Offsets int `json:"offsets"`
	Owners  int `json:"owners"`
	// Puts and Deletes are the writes to the v2 prefix; Unchanged the
	// keys it already held as the conversion has them. A second run has
	// no puts and no deletes.
	Puts      int `json:"puts"`
	Deletes   int `json:"deletes"`
	Unchanged int `json:"unchanged"`
	// Transactions is the transactions sent (dry: that would be).
	Transactions int `json:"transactions"`
	// Committed is the transactions etcd applied: all of them after a
	// run that succeeds, those before the error after one that fails
	// (what they wrote stays; a second run finishes it).
	Committed int `json:"transactions_committed"`
	// Skipped counts v1 keys not converted, by reason (bad_block_key,
	// bad_engine_hash, bad_endpoint_key, bad_endpoint_record,
	// blocks_without_record, bad_member_key, member_without_endpoint,
	// bad_offset_key, bad_owner_key), and v2 chunk keys outside every
	// endpoint, left alone (v2_chunks_without_record). Each skip is also
	// logged with its key.
	Skipped map[string]int `json:"skipped"`
	// MinLeaseTTL is the shortest remaining TTL, in seconds, of the leases
	// the v2 keys are attached to (-1: none): the v2 ingesters must start
	// before it runs out, or those endpoints expire.
	MinLeaseTTL int64 `json:"min_lease_ttl_seconds"`
}

func newReport(cfg *Config) *Report {
	return &Report{From: cfg.from().Prefix(), To: cfg.to().Prefix(), DryRun: cfg.DryRun,
		Blocks: map[string]int{}, Chunks: map[string]int{}, Skipped: map[string]int{}, MinLeaseTTL: -1}
}

// WriteText writes the report for a terminal.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	verb := "migrated"
	if r.DryRun {
		verb = "dry run: would migrate"
	}
	fmt.Fprintf(&b, "%s %s to %s, read at revision %d (attempt %d)\n", verb, r.From, r.To, r.Revision, r.Attempts)
	if r.empty() {
		fmt.Fprintf(&b, "note:      no v1 key under %s: nothing to migrate there (is the source prefix right?)\n", r.From)
	}
	fmt.Fprintf(&b, "endpoints: %d (%d token mode, %d engine mode)\n", r.Endpoints, r.TokenEndpoints, r.Endpoints-r.TokenEndpoints)
	fmt.Fprintf(&b, "blocks:    %s\n", perTier(r.Blocks))
	fmt.Fprintf(&b, "chunks:    %s\n", perTier(r.Chunks))
	fmt.Fprintf(&b, "members %d, offsets %d, owners %d\n", r.Members, r.Offsets, r.Owners)
	fmt.Fprintf(&b, "writes:    %d puts, %d deletes, %d keys unchanged, in %d transactions\n", r.Puts, r.Deletes, r.Unchanged, r.Transactions)
	if !r.DryRun && r.Committed != r.Transactions {
		fmt.Fprintf(&b, "committed: %d of the %d transactions sent before the error (what they wrote stays; run migrate again to finish)\n", r.Committed, r.Transactions)
	}
	if len(r.Skipped) == 0 {
		b.WriteString("skipped:   none\n")
	} else {
		reasons := make([]string, 0, len(r.Skipped))
		for k := range r.Skipped {
			reasons = append(reasons, k)
		}
		slices.Sort(reasons)
		for i, k := range reasons {
			reasons[i] = fmt.Sprintf("%s=%d", k, r.Skipped[k])
		}
		fmt.Fprintf(&b, "skipped:   %s (each logged with its key)\n", strings.Join(reasons, " "))
	}
	if r.MinLeaseTTL >= 0 {
		fmt.Fprintf(&b, "shortest lease TTL left: %ds: start the v2 ingesters before it runs out\n", r.MinLeaseTTL)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// empty reports whether the source prefix held nothing a migration reads
// (no endpoint, block, member, offset or owner, converted or skipped): a
// mistyped prefix, or a keyspace that was never v1.
func (r *Report) empty() bool {
	for k, n := range r.Skipped {
		if n > 0 && k != "v2_chunks_without_record" {
			return false
		}
	}
	blocks := 0
	for _, n := range r.Blocks {
		blocks += n
	}
	return r.Endpoints == 0 && blocks == 0 && r.Members == 0 && r.Offsets == 0 && r.Owners == 0
}

func perTier(m map[string]int) string {
	parts := make([]string, 0, tier.Count)
	for _, t := range tier.All {
		parts = append(parts, fmt.Sprintf("%s %d", t, m[t.String()]))
	}
	return strings.Join(parts, ", ")
}
