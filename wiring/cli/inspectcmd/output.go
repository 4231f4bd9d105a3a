package inspectcmd

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func hex(h uint64) string { return string(keyspace.AppendHash(nil, h)) }

// writeProblems lists the problems after a text listing.
func writeProblems(w io.Writer, probs []problem) error {
	if len(probs) == 0 {
		return nil
	}
	fmt.Fprintf(w, "%s (keys or values that do not parse):\n", plural(len(probs), "problem"))
	for _, p := range probs {
		if _, err := fmt.Fprintf(w, "  %s: %s\n", common.Display(p.Key), common.Display(p.Error)); err != nil {
			return err
		}
	}
	return nil
}

func allProblems(eps []*endpointScan, probs []problem) []problem {
	out := slices.Clone(probs)
	for _, e := range eps {
		out = append(out, e.Problems...)
	}
	if out == nil {
		out = []problem{}
	}
	return out
}

type endpointJSON struct {
	Model      string                           `json:"model"`
	Pod        string                           `json:"pod"`
	Rank       uint32                           `json:"rank"`
	HashMode   keyspace.HashMode                `json:"hash_mode,omitempty"`
	BlockSize  uint32                           `json:"block_size"`
	Topic      string                           `json:"topic"`
	Partition  int32                            `json:"partition"`
	LastRecord *time.Time                       `json:"last_record"`
	Lease      keyspace.LeaseID                 `json:"lease"`
	TierLeases map[string][]keyspace.LeaseShard `json:"tier_leases"`
	ChunkNext  map[string]uint64                `json:"chunk_next"`
}

func writeEndpoints(w io.Writer, output string, rev int64, eps []*endpointScan, probs []problem) error {
	probs = allProblems(eps, probs)
	var good []*endpointScan
	for _, e := range eps {
		if e.Record != nil {
			good = append(good, e)
		}
	}
	if output == "json" {
		out := struct {
			Revision  int64          `json:"revision"`
			Endpoints []endpointJSON `json:"endpoints"`
			Problems  []problem      `json:"problems"`
		}{Revision: rev, Endpoints: []endpointJSON{}, Problems: probs}
		for _, e := range good {
			r := e.Record
			j := endpointJSON{Model: e.Endpoint.Model, Pod: e.Endpoint.Pod, Rank: e.Endpoint.Rank, HashMode: r.HashMode, BlockSize: r.BlockSize,
				Topic: r.Topic, Partition: r.Partition, Lease: r.Lease, TierLeases: r.TierLeases, ChunkNext: e.ChunkNext}
			if !r.LastRecord.IsZero() {
				t := r.LastRecord.UTC()
				j.LastRecord = &t
			}
			out.Endpoints = append(out.Endpoints, j)
		}
		return writeJSON(w, out)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tPOD\tRANK\tHASH_MODE\tBLOCK_SIZE\tPARTITION\tLAST_RECORD\tLEASE\tCHUNK_NEXT")
	for _, e := range good {
		r := e.Record
		last := "-"
		if !r.LastRecord.IsZero() {
			last = r.LastRecord.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n", common.Display(e.Endpoint.Model), common.Display(e.Endpoint.Pod), e.Endpoint.Rank,
			r.HashMode, r.BlockSize, common.Display(r.Topic)+"/"+strconv.Itoa(int(r.Partition)), last, r.Lease, perTierNext(e.ChunkNext))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "%s at revision %d\n", plural(len(good), "endpoint"), rev); err != nil {
		return err
	}
	return writeProblems(w, probs)
}

func perTierNext(m map[string]uint64) string {
	var parts []string
	for _, t := range tier.All {
		if n, ok := m[t.String()]; ok {
			parts = append(parts, t.String()+"="+strconv.FormatUint(n, 10))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

type tierBlocksJSON struct {
	Tier         string   `json:"tier"`
	Chunks       int      `json:"chunks"`
	Blocks       []string `json:"blocks"`
	EngineHashes []string `json:"engine_hashes,omitempty"`
}

type rankBlocksJSON struct {
	Rank  uint32           `json:"rank"`
	Tiers []tierBlocksJSON `json:"tiers"`
}

// writeBlocks prints one pod's chunks as blocks, per rank and tier.
func writeBlocks(w io.Writer, output string, rev int64, model, pod string, chunks map[keyspace.Endpoint][]chunk, only tier.Tier, probs []problem) error {
	if probs == nil {
		probs = []problem{}
	}
	eps := slices.SortedFunc(maps.Keys(chunks), func(a, b keyspace.Endpoint) int { return int(int64(a.Rank) - int64(b.Rank)) })
	var ranks []rankBlocksJSON
	for _, ep := range eps {
		r := rankBlocksJSON{Rank: ep.Rank, Tiers: []tierBlocksJSON{}}
		for _, t := range tier.All {
			if only != tier.Unknown && t != only {
				continue
			}
			tb := tierBlocksJSON{Tier: t.String(), Blocks: []string{}}
			for _, c := range chunks[ep] {
				if c.Tier != t {
					continue
				}
				tb.Chunks++
				for _, e := range c.Entries {
					tb.Blocks = append(tb.Blocks, hex(e.Key))
					if c.Engine {
						tb.EngineHashes = append(tb.EngineHashes, hex(e.Engine))
					}
				}
			}
			if tb.Chunks > 0 {
				r.Tiers = append(r.Tiers, tb)
			}
		}
		if len(r.Tiers) > 0 {
			ranks = append(ranks, r)
		}
	}
	if output == "json" {
		if ranks == nil {
			ranks = []rankBlocksJSON{}
		}
		return writeJSON(w, struct {
			Revision  int64            `json:"revision"`
			Model     string           `json:"model"`
			Pod       string           `json:"pod"`
			Endpoints []rankBlocksJSON `json:"endpoints"`
			Problems  []problem        `json:"problems"`
		}{rev, model, pod, ranks, probs})
	}
	var b strings.Builder
	for _, r := range ranks {
		for _, tb := range r.Tiers {
			fmt.Fprintf(&b, "# %s %s rank %d %s: %s in %s\n", common.Display(model), common.Display(pod), r.Rank, tb.Tier,
				plural(len(tb.Blocks), "block"), plural(tb.Chunks, "chunk"))
			for _, h := range tb.Blocks {
				b.WriteString(h)
				b.WriteByte('\n')
			}
		}
	}
	if len(ranks) == 0 {
		fmt.Fprintf(&b, "# %s %s: no blocks at revision %d\n", common.Display(model), common.Display(pod), rev)
	}
	// Problems are comment lines too, so `grep -v '^#'` leaves hashes only.
	for _, p := range probs {
		fmt.Fprintf(&b, "# problem: %s: %s\n", common.Display(p.Key), common.Display(p.Error))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

type endpointFillJSON struct {
	Model string       `json:"model"`
	Pod   string       `json:"pod"`
	Rank  uint32       `json:"rank"`
	Tiers []*fillStats `json:"tiers"`
}

func writeChunks(w io.Writer, output string, rev int64, chunkSize int, eps []*endpointScan, probs []problem) error {
	probs = allProblems(eps, probs)
	var totals []*fillStats
	for _, t := range tier.All {
		totals = append(totals, newFill(t, chunkSize, true))
	}
	perEndpoint := []endpointFillJSON{}
	for _, e := range eps {
		j := endpointFillJSON{Model: e.Endpoint.Model, Pod: e.Endpoint.Pod, Rank: e.Endpoint.Rank, Tiers: []*fillStats{}}
		for i, t := range tier.All {
			f := newFill(t, chunkSize, false)
			for _, c := range e.Chunks {
				if c.Tier == t {
					f.add(len(c.Entries))
					totals[i].add(len(c.Entries))
				}
			}
			if f.Chunks > 0 {
				f.done(chunkSize)
				j.Tiers = append(j.Tiers, f)
			}
		}
		if len(j.Tiers) > 0 {
			perEndpoint = append(perEndpoint, j)
		}
	}
	for _, f := range totals {
		f.done(chunkSize)
	}
	if output == "json" {
		return writeJSON(w, struct {
			Revision  int64              `json:"revision"`
			ChunkSize int                `json:"chunk_size"`
			Endpoints []endpointFillJSON `json:"endpoints"`
			Tiers     []*fillStats       `json:"tiers"`
			Problems  []problem          `json:"problems"`
		}{rev, chunkSize, perEndpoint, totals, probs})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tPOD\tRANK\tTIER\tCHUNKS\tENTRIES\tFILL\tMIN\tMEAN\tMAX")
	row := func(model, pod, rank string, f *fillStats) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%.3f\t%d\t%.1f\t%d\n", model, pod, rank, f.Tier, f.Chunks, f.Entries, f.Fill, f.Min, f.Mean, f.Max)
	}
	for _, e := range perEndpoint {
		for _, f := range e.Tiers {
			row(common.Display(e.Model), common.Display(e.Pod), strconv.FormatUint(uint64(e.Rank), 10), f)
		}
	}
	for _, f := range totals {
		row("(all)", "", "", f)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "entries per chunk (chunk size %d) at revision %d:\n", chunkSize, rev)
	for _, f := range totals {
		parts := make([]string, len(f.Histogram))
		for i, b := range f.Histogram {
			parts[i] = fmt.Sprintf("%d-%d:%d", b.From, b.To, b.Chunks)
		}
		fmt.Fprintf(w, "  %-4s %s\n", f.Tier, strings.Join(parts, " "))
	}
	return writeProblems(w, probs)
}

type modelJSON struct {
	Model     string         `json:"model"`
	Endpoints int            `json:"endpoints"`
	Chunks    map[string]int `json:"chunks"`
	Blocks    map[string]int `json:"blocks"`
}

func writeModels(w io.Writer, output string, rev int64, eps []*endpointScan, probs []problem) error {
	probs = allProblems(eps, probs)
	byModel := map[string]*modelJSON{}
	for _, e := range eps {
		if e.Record == nil {
			// As endpoints lists them: a record that does not decode
			// is a problem (listed), not an endpoint.
			continue
		}
		m := byModel[e.Endpoint.Model]
		if m == nil {
			m = &modelJSON{Model: e.Endpoint.Model, Chunks: map[string]int{}, Blocks: map[string]int{}}
			for _, t := range tier.All {
				m.Chunks[t.String()], m.Blocks[t.String()] = 0, 0
			}
			byModel[e.Endpoint.Model] = m
		}
		m.Endpoints++
		for _, c := range e.Chunks {
			m.Chunks[c.Tier.String()]++
			m.Blocks[c.Tier.String()] += len(c.Entries)
		}
	}
	models := []*modelJSON{}
	for _, name := range slices.Sorted(maps.Keys(byModel)) {
		models = append(models, byModel[name])
	}
	if output == "json" {
		return writeJSON(w, struct {
			Revision int64        `json:"revision"`
			Models   []*modelJSON `json:"models"`
			Problems []problem    `json:"problems"`
		}{rev, models, probs})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tENDPOINTS\tGPU_BLOCKS\tCPU_BLOCKS\tDISK_BLOCKS\tGPU_CHUNKS\tCPU_CHUNKS\tDISK_CHUNKS")
	for _, m := range models {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", common.Display(m.Model), m.Endpoints,
			m.Blocks["gpu"], m.Blocks["cpu"], m.Blocks["disk"], m.Chunks["gpu"], m.Chunks["cpu"], m.Chunks["disk"])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "%s at revision %d\n", plural(len(models), "model"), rev); err != nil {
		return err
	}
	return writeProblems(w, probs)
}

// plural is n and noun, with an s unless n is 1: "1 chunk", "3 chunks".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
