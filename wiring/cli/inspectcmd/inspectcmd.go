// Package inspectcmd wires `kvindex inspect`: read-only views of the v2
// keyspace read from etcd directly, with indexd's etcd flags, for
// operators (README, "Inspecting the index"). Its subcommands list the
// endpoints, one pod's blocks per tier, the chunks' fill and the counts
// per model, as text or, with -o json, one JSON object each. With a cell
// map (--cell-map) the endpoint listing goes through every cell's indexd
// instead (cells.go); the chunk-level views stay per cell.
package inspectcmd

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

// usagef is common.Usagef: bad command-line input, exit status 2.
var usagef = common.Usagef

// Defaults of the shared flags (docs/limits.md, "Tools").
const (
	defaultPageSize    = 1000
	defaultConcurrency = 8
	defaultTimeout     = time.Minute
)

// options holds the flags every subcommand shares.
type options struct {
	log         common.Logging
	etcd        common.Etcd
	output      string
	pageSize    int
	concurrency int
	timeout     time.Duration
	model, pod  string
	chunkSize   int
	cellMap     string           // --cell-map: endpoints of every cell, through each cell's indexd
	tls         common.ClientTLS // indexd's TLS, with --cell-map
}

// NewCommand returns `kvindex inspect` and its subcommands.
func NewCommand() *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "inspect (endpoints | blocks | chunks | models)",
		Short: "Show what the index holds in etcd: endpoints, a pod's blocks, chunk fill, counts per model",
		Long: `inspect reads kvindex's etcd keyspace (v2: DESIGN "etcd keyspace (v2)")
directly, with indexd's etcd flags, at one revision, and prints what it
holds. It never writes. It reads the endpoints/ range, then each
endpoint's own chunks/ range, --list-concurrency at once, in pages of
--page-size keys; --timeout bounds the whole command.

  endpoints  the endpoint records: hash mode, block size, partition, last
             record, leases, chunk_next
  blocks     one pod's blocks (--model, --pod, optionally --rank, --tier),
             per rank and tier, one hex key hash per line in chunk order
  chunks     chunk fill per endpoint and tier, and per tier in total:
             chunks, entries, fill ratio, min/mean/max, a histogram
  models     per model: endpoints, chunks and blocks per tier

Keys and values that do not parse are listed as problems (and in JSON
under "problems"), never a failure. In text, names that are not
printable (control characters, invalid UTF-8, or starting with a double
quote) are shown Go-quoted; -o json prints them as they are.

Cells (docs/DESIGN.md "Cells"): a cell map names each cell's indexd, not
its etcd, so with --cell-map FILE "endpoints" pages through every cell's
indexd ListEndpoints (--model: the cells routers read that model from)
and says each endpoint's cell; the --tls-* flags are indexd's. blocks,
chunks and models read chunk keys, which only a cell's etcd has: run them
per cell with that cell's --etcd-endpoints.`,
		// Runnable, so that an unknown subcommand is a usage error (exit
		// code 2) instead of the help and exit code 0.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q for %q: want endpoints, blocks, chunks or models", args[0], cmd.CommandPath())
			}
			return nil
		},
		RunE: func(*cobra.Command, []string) error {
			return usagef("inspect needs a subcommand: endpoints, blocks, chunks or models")
		},
	}
	fs := cmd.PersistentFlags()
	o.log.Register(fs)
	o.etcd.Register(fs)
	fs.StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	fs.IntVar(&o.pageSize, "page-size", defaultPageSize, "most keys per etcd range read")
	fs.IntVar(&o.concurrency, "list-concurrency", defaultConcurrency, "endpoint chunk ranges read from etcd at once")
	fs.DurationVar(&o.timeout, "timeout", defaultTimeout, "deadline of the whole command")
	fs.StringVar(&o.cellMap, "cell-map", "", "cell map file (docs/DESIGN.md \"Cells\"): endpoints lists every cell's endpoints through each cell's indexd, naming each one's cell, instead of reading one etcd (endpoints only)")
	o.tls.Register(fs)
	for _, sub := range []*cobra.Command{o.endpointsCmd(), o.blocksCmd(), o.chunksCmd(), o.modelsCmd()} {
		cmd.AddCommand(sub)
	}
	return cmd
}

// scope adds --model and --pod (a pod needs its model).
func (o *options) scope(cmd *cobra.Command, what string) {
	cmd.Flags().StringVar(&o.model, "model", "", what+" of this model only")
	cmd.Flags().StringVar(&o.pod, "pod", "", what+" of this pod only (with --model)")
}

// check validates the flags every subcommand shares.
func (o *options) check(cmd *cobra.Command) error {
	if o.output != "text" && o.output != "json" {
		return usagef("-o %q: want text or json", o.output)
	}
	if err := common.CheckPositive(cmd.Flags(), "page-size", "list-concurrency", "timeout", "etcd-dial-timeout"); err != nil {
		return usagef("%v", err)
	}
	if o.pod != "" && o.model == "" {
		return usagef("--pod needs --model")
	}
	for _, f := range []struct{ what, v string }{{"model", o.model}, {"pod", o.pod}} {
		if f.v != "" {
			if err := keyspace.ValidateName(f.what, f.v); err != nil {
				return usagef("--%s: %v", f.what, err)
			}
		}
	}
	return nil
}

// run checks the shared flags, connects to etcd, and calls fn with a
// scanner at one revision.
func (o *options) run(cmd *cobra.Command, fn func(ctx context.Context, s *scanner) error) error {
	if o.cellMap != "" {
		return usagef("%s", errCellsEtcdOnly)
	}
	if err := o.check(cmd); err != nil {
		return err
	}
	ks, err := o.etcd.Keyspace()
	if err != nil {
		return usagef("%v", err)
	}
	log, err := o.log.Logger()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	cli, err := o.etcd.Client(ctx, log)
	if err != nil {
		return err
	}
	defer cli.Close()
	if err := o.etcd.Reach(ctx, cli, ks.Prefix()); err != nil {
		return err
	}
	s := &scanner{kv: cli, ks: ks, page: o.pageSize, concurrency: o.concurrency, readTimeout: o.etcd.DialTimeout}
	if err := s.start(ctx); err != nil {
		return err
	}
	return fn(ctx, s)
}

// endpointsPrefix is the endpoints/ range the scope covers.
func (o *options) endpointsPrefix(ks keyspace.Keyspace) string {
	switch {
	case o.pod != "":
		return podEndpointsPrefix(ks, o.model, o.pod)
	case o.model != "":
		return ks.ModelEndpointsPrefix(o.model)
	}
	return ks.EndpointsPrefix()
}

// chunksPrefix is the chunks/ range the scope covers.
func (o *options) chunksPrefix(ks keyspace.Keyspace) string {
	switch {
	case o.pod != "":
		return podChunksPrefix(ks, o.model, o.pod)
	case o.model != "":
		return ks.ModelChunksPrefix(o.model)
	}
	return ks.ChunksPrefix()
}

func (o *options) endpointsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "endpoints [--model M [--pod P]]",
		Short: "List the endpoint records: hash mode, block size, partition, last record, leases",
		Long: `endpoints lists the endpoint records in etcd.

With -o json it prints one object:
  {"revision": N, "endpoints": [{"model": M, "pod": P, "rank": N,
    "hash_mode": "token" | "engine", "block_size": N, "topic": T,
    "partition": N, "last_record": RFC3339, "lease": HEX,
    "tier_leases": {"gpu": [{"id": HEX, "keys": N}]},
    "chunk_next": {"gpu": N}}], "problems": [{"key": K, "error": E}]}

With --cell-map FILE it reads no etcd: it pages (--page-size endpoints a
page) through the ListEndpoints of each cell's indexd, in map order, every
cell or --model's read cells (the pod filter is applied to the pages).
Each endpoint carries its cell and its blocks per tier; leases, chunk_next
and key problems are etcd's and are not shown (run endpoints per cell with
--etcd-endpoints for them). A cell that does not answer fails the command,
naming it. With -o json it prints one object:
  {"cells": [{"cell": C, "indexd": TARGET, "topic": T, "endpoints": N,
    "revision": N, "max_revision": N, "pages": N}],
   "endpoints": [{"cell": C, "model": M, "pod": P, "rank": N,
    "hash_mode": "token" | "engine" | "unspecified", "block_size": N,
    "partition": N, "last_record": RFC3339 or null,
    "blocks": {"gpu": N, "cpu": N, "disk": N}}]}
A cell's revisions are its own etcd's; two cells' do not compare.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.cellMap != "" {
				return o.runCellEndpoints(cmd)
			}
			return o.run(cmd, func(ctx context.Context, s *scanner) error {
				eps, probs, err := s.endpoints(ctx, o.endpointsPrefix(s.ks))
				if err != nil {
					return err
				}
				return writeEndpoints(cmd.OutOrStdout(), o.output, s.rev, eps, probs)
			})
		},
	}
	o.scope(cmd, "endpoints")
	return cmd
}

func (o *options) blocksCmd() *cobra.Command {
	var (
		rank     uint32
		tierName string
	)
	cmd := &cobra.Command{
		Use:   "blocks --model M --pod P [--rank R] [--tier T]",
		Short: "Print one pod's blocks per rank and tier, one hex key hash per line, in chunk order",
		Long: `blocks prints the blocks of one pod (every rank, or --rank), per rank and
tier (every tier, or --tier): a header line starting with '#', then one
key hash per line as 16 hex digits, in chunk order (insertion order);
problems are '#' lines too, so grep -v '^#' leaves the hashes alone.
The key hash is what routers look up; token-mode chunks also carry each
block's engine hash, which -o json prints beside it.

With -o json it prints one object:
  {"revision": N, "model": M, "pod": P, "endpoints": [{"rank": N,
    "tiers": [{"tier": "gpu", "chunks": N, "blocks": [HEX, ...],
    "engine_hashes": [HEX, ...] (token mode)}]}],
   "problems": [{"key": K, "error": E}]}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.model == "" || o.pod == "" {
				return usagef("blocks needs --model and --pod")
			}
			only := tier.Unknown
			if tierName != "" {
				t, ok := tier.Parse(tierName)
				if !ok {
					return usagef("--tier %q: want gpu, cpu or disk", tierName)
				}
				only = t
			}
			hasRank := cmd.Flags().Changed("rank")
			return o.run(cmd, func(ctx context.Context, s *scanner) error {
				prefix := podChunksPrefix(s.ks, o.model, o.pod)
				if hasRank {
					prefix = s.ks.EndpointChunksPrefix(keyspace.Endpoint{Model: o.model, Pod: o.pod, Rank: rank})
				}
				chunks, probs, err := s.chunks(ctx, prefix)
				if err != nil {
					return err
				}
				return writeBlocks(cmd.OutOrStdout(), o.output, s.rev, o.model, o.pod, chunks, only, probs)
			})
		},
	}
	cmd.Flags().StringVar(&o.model, "model", "", "the pod's model (required)")
	cmd.Flags().StringVar(&o.pod, "pod", "", "the pod (required)")
	cmd.Flags().Uint32Var(&rank, "rank", 0, "only this data-parallel rank (default: every rank)")
	cmd.Flags().StringVar(&tierName, "tier", "", "only this tier: gpu, cpu or disk (default: every tier)")
	return cmd
}

func (o *options) chunksCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "chunks [--model M [--pod P]]",
		Short: "Show chunk fill per endpoint and tier, and per tier in total",
		Long: `chunks reads every chunk of the endpoints in scope and prints, per
endpoint and tier and per tier in total, the chunks, the entries (blocks),
the fill ratio (entries / (chunks × --chunk-size)) and the entries per
chunk (min, mean, max), with a histogram of entries per chunk per tier.
Chunk keys under no endpoint record are a problem per endpoint they name
(up to 100, the rest counted in one). So is a chunk a writer never
leaves: entries of the other hash mode's width, a sequence at or past
the record's chunk_next, or a key hash already in the tier (the ingester
repairs each when it next rebuilds the endpoint). models checks the same.

With -o json it prints one object:
  {"revision": N, "chunk_size": N,
   "endpoints": [{"model": M, "pod": P, "rank": N, "tiers": [FILL, ...]}],
   "tiers": [FILL with "histogram": [{"from": N, "to": N, "chunks": N}]],
   "problems": [{"key": K, "error": E}]}
where FILL is {"tier": T, "chunks": N, "entries": N, "fill": F,
"min": N, "mean": F, "max": N}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := common.CheckPositive(cmd.Flags(), "chunk-size"); err != nil {
				return usagef("%v", err)
			}
			if o.chunkSize > keyspace.MaxChunkEntries {
				return usagef("--chunk-size %d: want 1 to %d (the ingesters' bound)", o.chunkSize, keyspace.MaxChunkEntries)
			}
			return o.run(cmd, func(ctx context.Context, s *scanner) error {
				eps, probs, err := o.scan(ctx, s)
				if err != nil {
					return err
				}
				return writeChunks(cmd.OutOrStdout(), o.output, s.rev, o.chunkSize, eps, probs)
			})
		},
	}
	o.scope(cmd, "chunks")
	cmd.Flags().IntVar(&o.chunkSize, "chunk-size", keyspace.DefaultChunkSize, "the ingesters' --chunk-size (1 to 256), the fill ratio's denominator")
	return cmd
}

func (o *options) modelsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "models [--model M]",
		Short: "Count endpoints, chunks and blocks per model and tier",
		Long: `models counts, per model, its endpoints and its chunks and blocks per
tier, reading every chunk's value (a block count needs it).

With -o json it prints one object:
  {"revision": N, "models": [{"model": M, "endpoints": N,
    "chunks": {"gpu": N, "cpu": N, "disk": N},
    "blocks": {"gpu": N, "cpu": N, "disk": N}}],
   "problems": [{"key": K, "error": E}]}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd, func(ctx context.Context, s *scanner) error {
				eps, probs, err := o.scan(ctx, s)
				if err != nil {
					return err
				}
				return writeModels(cmd.OutOrStdout(), o.output, s.rev, eps, probs)
			})
		},
	}
	cmd.Flags().StringVar(&o.model, "model", "", "this model only")
	return cmd
}

// scan lists the endpoints in scope with their chunks, checks the chunks
// against their records (checkChunks), and names the endpoints of the
// scope's chunk keys that no endpoint record covers (scanner.orphans).
func (o *options) scan(ctx context.Context, s *scanner) ([]*endpointScan, []problem, error) {
	eps, probs, err := s.endpoints(ctx, o.endpointsPrefix(s.ks))
	if err != nil {
		return nil, nil, err
	}
	if err := s.fill(ctx, eps); err != nil {
		return nil, nil, err
	}
	prefix := o.chunksPrefix(s.ks)
	total, err := s.count(ctx, prefix)
	if err != nil {
		return nil, nil, err
	}
	var seen int64
	for _, e := range eps {
		seen += int64(len(e.Chunks))
		for _, p := range e.Problems {
			if s.ks.KindOf(p.Key) == keyspace.KindChunk {
				seen++
			}
		}
	}
	if total > seen {
		orphans, err := s.orphans(ctx, prefix, eps, total-seen)
		if err != nil {
			return nil, nil, err
		}
		probs = append(probs, orphans...)
	}
	// After the count above: these problems are of chunks already seen.
	for _, e := range eps {
		e.Problems = append(e.Problems, checkChunks(s.ks, e)...)
	}
	return eps, probs, nil
}
