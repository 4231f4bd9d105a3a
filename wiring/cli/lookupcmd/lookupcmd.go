// Package lookupcmd wires the operator views `kvindex lookup` (which
// endpoints hold a prefix) and `kvindex endpoints` (which endpoints the
// index knows), both through the public client library. They print
// human-readable tables by default and one JSON object with -o json.
package lookupcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/client/cellmap"
	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

// errUsage marks bad command-line input (common.ErrUsage; exit status 2).
var errUsage = common.ErrUsage

// usagef is common.Usagef.
var usagef = common.Usagef

// conn holds the flags both commands share.
type conn struct {
	index   string
	output  string
	timeout time.Duration
	tls     common.ClientTLS
	cellMap string // --cell-map: ask every cell of the map instead of --index
}

func (c *conn) register(fs *pflag.FlagSet, what string) {
	fs.StringVar(&c.index, "index", contract.DefaultGRPCAddr, "indexd address: host:port, a comma-separated list, or a gRPC target such as dns:///indexd:50051")
	fs.StringVarP(&c.output, "output", "o", "table", "output format: table or json")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "deadline of "+what)
	fs.StringVar(&c.cellMap, "cell-map", "", "cell map file (docs/DESIGN.md \"Cells\"): ask the cells it names instead of --index (a spread model's Lookup fans out; endpoints pages across every cell)")
	c.tls.Register(fs)
}

// check validates the shared flags.
func (c *conn) check(fs *pflag.FlagSet) error {
	if c.output != "table" && c.output != "json" {
		return usagef("-o %q: want table or json", c.output)
	}
	if err := common.CheckPositive(fs, "timeout"); err != nil {
		return usagef("%v", err)
	}
	if c.index == "" && c.cellMap == "" {
		return usagef("--index must not be empty (an indexd host:port, or a cell map with --cell-map)")
	}
	return nil
}

// client returns a client whose calls, each bounded by --timeout, run
// under the returned context, which --timeout bounds as a whole.
func (c *conn) client(ctx context.Context) (*client.Client, context.Context, context.CancelFunc, error) {
	opts, err := c.tls.Options()
	if err != nil {
		return nil, nil, nil, usagef("%v", err)
	}
	target := c.index
	if c.cellMap != "" {
		m, err := cellmap.Load(c.cellMap)
		if err != nil {
			return nil, nil, nil, usagef("--cell-map: %v", err)
		}
		target, opts = "", append(opts, client.WithCells(m))
	}
	cl, err := client.New(target, append(opts, client.WithTimeout(c.timeout))...)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	return cl, ctx, cancel, nil
}

// barrierShare is the part of --timeout a barrier waits by default,
// leaving the rest for the answer: a barrier that is not met then ends
// with the server's message naming the lagging partition, not with the
// call's bare deadline.
const barrierShare = 0.9

// barrierWait is the barrier timeout of a lookup: --barrier-timeout when
// given, else barrierShare of --timeout, at most indexd's default
// longest barrier timeout (which a server refuses to exceed unless
// configured otherwise).
func barrierWait(timeout, barrierTimeout time.Duration) (time.Duration, error) {
	switch {
	case barrierTimeout < 0:
		return 0, usagef("--barrier-timeout must not be negative, got %s", barrierTimeout)
	case barrierTimeout >= timeout:
		return 0, usagef("--barrier-timeout %s must be shorter than --timeout %s, which bounds the whole call", barrierTimeout, timeout)
	case barrierTimeout > 0:
		return barrierTimeout, nil
	}
	return min(time.Duration(float64(timeout)*barrierShare), indexd.DefaultMaxBarrierTimeout), nil
}

// hashesOrTokens refuses a lookup without block hashes or --tokens, or
// with both, saying what is wrong.
func hashesOrTokens(cmd *cobra.Command, args []string) error {
	tokens := cmd.Flags().Changed("tokens")
	switch {
	case tokens && len(args) > 0:
		return usagef("give either block hashes or --tokens, not both")
	case !tokens && len(args) == 0:
		return usagef("no block hashes: give the prefix's block hashes in order, first block first (for example: kvindex lookup --model M e5068d13bba8906f 1c92a7b9b9bec94f), or its token ids with --tokens")
	case !tokens:
		for _, f := range []string{"lora-name", "cache-salt", "multimodal", "block-size"} {
			if cmd.Flags().Changed(f) {
				return usagef("--%s goes with --tokens", f)
			}
		}
	}
	return nil
}

// NewCommand returns `kvindex lookup`.
func NewCommand() *cobra.Command {
	var f lookupFlags
	cmd := &cobra.Command{
		Use:   "lookup --model MODEL (HASH... | --tokens IDS)",
		Short: "Show which endpoints hold the leading blocks of a prefix",
		Long: `lookup asks an indexd replica which endpoints hold the leading blocks of a
prefix, given its block hashes in order (64-bit hex as in KV events and the
fixtures, optionally 0x-prefixed), and prints per endpoint how many leading
blocks it holds and each block's best tier.

--tokens gives the prompt as token ids instead (a comma-separated list, or
@FILE: ids separated by commas or white space, optionally in [ ]): the
replica keys them with kvindex's canonical key (docs/hashing.md) at the
block size of each endpoint in token mode, with the extras --lora-name,
--cache-salt and --multimodal; each match then says its block size and
how many prompt tokens it holds. With --block-size N the command keys the
tokens itself at N (client.TokenKeys) and looks the keys up as block
hashes, as a router that hashes locally would.

--after makes the answer wait until the named produced records are applied
(read-your-events); --timeout bounds the whole call, that wait included,
and the wait itself is --barrier-timeout (by default nine tenths of
--timeout, so a barrier that is not met is reported with the partition
that lags). In the table, names that are not printable (control
characters, invalid UTF-8, or starting with a double quote) are shown
Go-quoted; -o json prints them as they are.

With -o json it prints one object:
  {"endpoints": [{"pod": P, "dp_rank": N, "blocks": N, "block_size": N,
    "tiers": ["gpu", ...]}],
   "revision": N, "offsets": {"topic/partition": next offset, ...}}`,
		Example: `  kvindex lookup --model meta-llama/Llama-3.1-8B-Instruct e5068d13bba8906f 1c92a7b9b9bec94f
  kvindex lookup --model m -o json --candidate vllm-0 --candidate vllm-1#1 0x9f4d1a9e22efe02c
  kvindex lookup --model m --tokens 128000,9906,1917,0,315 --lora-name sql-lora
  kvindex lookup --model m --tokens @prompt.txt --multimodal img-a3f1:12:576`,
		Args: hashesOrTokens,
		RunE: f.run,
	}
	f.register(cmd.Flags())
	return cmd
}

// lookupFlags holds the flags of `kvindex lookup`.
type lookupFlags struct {
	c              conn
	model          string
	candidates     []string
	barriers       []string
	barrierTimeout time.Duration
	tokens         string
	prompt         client.TokenPrompt
	multimodal     []string
	blockSize      int
}

func (f *lookupFlags) register(fs *pflag.FlagSet) {
	f.c.register(fs, "the whole call, a barrier's wait (--after) included")
	fs.StringVar(&f.model, "model", "", "served model name (required)")
	fs.StringArrayVar(&f.candidates, "candidate", nil, "limit the answer to this endpoint, POD or POD#RANK (repeatable)")
	fs.StringArrayVar(&f.barriers, "after", nil, "wait until this produced record is applied: TOPIC/PARTITION@OFFSET (repeatable)")
	fs.DurationVar(&f.barrierTimeout, "barrier-timeout", 0, "how long the server waits for the --after records; shorter than --timeout (0: nine tenths of --timeout, at most 1m)")
	fs.StringVar(&f.tokens, "tokens", "", "the prompt's token ids instead of block hashes: ID,ID,... or @FILE (ids separated by commas or white space)")
	fs.StringVar(&f.prompt.LoRAName, "lora-name", "", "with --tokens: the LoRA adapter the request runs with (an extra of every block)")
	fs.StringVar(&f.prompt.CacheSalt, "cache-salt", "", "with --tokens: the request's cache salt (an extra of block 0)")
	fs.StringArrayVar(&f.multimodal, "multimodal", nil, "with --tokens: a multimodal item HASH:OFFSET:LENGTH (its placeholder tokens), in prompt order (repeatable)")
	fs.IntVar(&f.blockSize, "block-size", 0, "with --tokens: key the tokens here at this block size and look the keys up as block hashes")
}

// query parses what to look up: block hashes, or with useTokens the
// prompt in f.prompt (for the replica to key).
func (f *lookupFlags) query(fs *pflag.FlagSet, args []string) (hashes []uint64, useTokens bool, err error) {
	if !fs.Changed("tokens") {
		hashes, err = parseHashes(args)
		return hashes, false, err
	}
	ids, err := parseTokens(f.tokens)
	if err != nil {
		return nil, false, err
	}
	f.prompt.TokenIDs = ids
	if f.prompt.MultiModal, err = parseMultiModal(f.multimodal); err != nil {
		return nil, false, err
	}
	if !fs.Changed("block-size") {
		return nil, true, nil
	}
	if f.blockSize <= 0 {
		return nil, false, usagef("--block-size must be positive, got %d", f.blockSize)
	}
	return client.TokenKeys(f.prompt, f.blockSize), false, nil
}

// options returns the Lookup options of --candidate and --after.
func (f *lookupFlags) options() ([]client.LookupOption, error) {
	var opts []client.LookupOption
	if len(f.candidates) > 0 {
		eps, err := parseEndpoints(f.candidates)
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithCandidates(eps...))
	}
	if len(f.barriers) == 0 && f.barrierTimeout != 0 {
		return nil, usagef("--barrier-timeout goes with --after (without a barrier nothing waits)")
	}
	if len(f.barriers) > 0 {
		recs, err := parseBarriers(f.barriers)
		if err != nil {
			return nil, err
		}
		wait, err := barrierWait(f.c.timeout, f.barrierTimeout)
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithBarrier(wait, recs...))
	}
	return opts, nil
}

// run is the command's RunE: one Lookup, printed.
func (f *lookupFlags) run(cmd *cobra.Command, args []string) error {
	if err := f.c.check(cmd.Flags()); err != nil {
		return err
	}
	if f.model == "" {
		return usagef("--model is required")
	}
	hashes, useTokens, err := f.query(cmd.Flags(), args)
	if err != nil {
		return err
	}
	opts, err := f.options()
	if err != nil {
		return err
	}
	cl, ctx, cancel, err := f.c.client(cmd.Context())
	if err != nil {
		return err
	}
	defer cancel()
	defer cl.Close()
	var res *client.LookupResult
	if useTokens {
		res, err = cl.LookupTokens(ctx, f.model, f.prompt, opts...)
	} else {
		res, err = cl.Lookup(ctx, f.model, hashes, opts...)
	}
	if err != nil {
		return err
	}
	if f.c.output == "json" {
		return writeLookupJSON(cmd.OutOrStdout(), res)
	}
	v := tokenView{hashes: len(hashes), blockSize: f.blockSize, tokens: len(f.prompt.TokenIDs), none: noMatch(ctx, cl, f.model)}
	if useTokens {
		v.hashes, v.blockSize = 0, 0
	}
	return writeLookupTable(cmd.OutOrStdout(), res, v)
}

// noMatch is the line the table prints under no match: that no endpoint
// holds the first block or, when one page of ListEndpoints says the index
// knows no endpoint of model at all, that (a misspelt --model reads the
// same as a cold prompt otherwise). A failing ListEndpoints keeps the
// first: the lookup itself has answered.
func noMatch(ctx context.Context, cl *client.Client, model string) func() string {
	return func() string {
		if page, err := cl.ListEndpointsPage(ctx, model, 1, ""); err == nil && len(page.Endpoints) == 0 {
			return fmt.Sprintf("(no endpoint of model %s is known to the index)", common.Display(model))
		}
		return "(no endpoint holds the first block)"
	}
}

// maxTokenFileBytes bounds a --tokens @FILE: ten times what the server's
// default --max-tokens of ids takes at seven bytes each.
const maxTokenFileBytes = 10 * 7 * indexd.DefaultMaxTokens

// parseTokens parses --tokens: ID,ID,... or @FILE.
func parseTokens(spec string) ([]uint32, error) {
	text := spec
	if name, ok := strings.CutPrefix(spec, "@"); ok {
		f, err := os.Open(name)
		if err != nil {
			return nil, usagef("--tokens %s: %v", spec, err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxTokenFileBytes+1))
		if err != nil {
			return nil, usagef("--tokens %s: %v", spec, err)
		}
		if len(b) > maxTokenFileBytes {
			return nil, usagef("--tokens %s: the file is over %d bytes", spec, maxTokenFileBytes)
		}
		text = strings.TrimSpace(string(b))
		if t, ok := strings.CutPrefix(text, "["); ok {
			if text, ok = strings.CutSuffix(t, "]"); !ok {
				return nil, usagef("--tokens %s: a [ without its ]", spec)
			}
		}
	}
	// Commas separate ids, and so does white space; an empty element
	// between commas (or a leading or trailing comma) is a mistake, not
	// a token to skip.
	var fields []string
	empty := 0 // the 1-based position of the first empty element
	parts := strings.Split(text, ",")
	for _, part := range parts {
		ids := strings.Fields(part)
		if len(ids) == 0 && len(parts) > 1 && empty == 0 {
			empty = len(fields) + 1
		}
		fields = append(fields, ids...)
	}
	if empty > 0 && len(fields) > 0 {
		return nil, usagef("--tokens: token %d is empty (two commas in a row, or a comma at an end)", empty)
	}
	out := make([]uint32, len(fields))
	for i, f := range fields {
		v, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, usagef("--tokens: token %d %q is not a token id (a decimal from 0 to %d)", i+1, f, uint32(math.MaxUint32))
		}
		out[i] = uint32(v)
	}
	if len(out) == 0 {
		return nil, usagef("--tokens %q holds no token id", spec)
	}
	return out, nil
}

// parseMultiModal parses --multimodal HASH:OFFSET:LENGTH (the hash may
// itself contain ':'; the last two fields are the span).
func parseMultiModal(specs []string) ([]client.MultiModalItem, error) {
	var out []client.MultiModalItem
	for _, s := range specs {
		j := strings.LastIndexByte(s, ':')
		i := -1
		if j > 0 {
			i = strings.LastIndexByte(s[:j], ':')
		}
		if i <= 0 {
			return nil, usagef("--multimodal %q: want HASH:OFFSET:LENGTH", s)
		}
		off, err1 := strconv.ParseUint(s[i+1:j], 10, 32)
		n, err2 := strconv.ParseUint(s[j+1:], 10, 32)
		if err := errors.Join(err1, err2); err != nil || n == 0 {
			return nil, usagef("--multimodal %q: want HASH:OFFSET:LENGTH with a length of at least 1", s)
		}
		out = append(out, client.MultiModalItem{Hash: s[:i], Offset: int(off), Length: int(n)})
	}
	return out, nil
}

// NewEndpointsCommand returns `kvindex endpoints`.
func NewEndpointsCommand() *cobra.Command {
	var (
		c     conn
		model string
	)
	cmd := &cobra.Command{
		Use:   "endpoints [--model MODEL]",
		Short: "List the endpoints the index knows, with block counts per tier",
		Long: `endpoints lists the endpoints an indexd replica knows (of one model with
--model), with their block counts per tier, block size, Kafka partition and
the time of their last KV event batch or heartbeat. It reads the list page
by page, so any number of endpoints works; --timeout bounds the whole
listing. Each page reflects the etcd revision it was answered at: the
footer (and "revision", "max_revision" in JSON) gives the lowest and the
highest, equal unless the index changed while the pages were read. In
the table, names that are not printable are shown Go-quoted.

With -o json it prints one object:
  {"endpoints": [{"model": M, "pod": P, "dp_rank": N, "gpu_blocks": N,
    "cpu_blocks": N, "disk_blocks": N, "block_size": N,
    "hash_mode": "token" | "engine" | "unspecified", "partition": N,
    "last_seen": RFC3339 or null}], "revision": N, "max_revision": N}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.check(cmd.Flags()); err != nil {
				return err
			}
			cl, ctx, cancel, err := c.client(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			defer cl.Close()
			list, err := cl.ListEndpoints(ctx, model)
			if err != nil {
				return err
			}
			if c.output == "json" {
				return writeEndpointsJSON(cmd.OutOrStdout(), list)
			}
			return writeEndpointsTable(cmd.OutOrStdout(), list)
		},
	}
	c.register(cmd.Flags(), "the whole listing, every page included")
	cmd.Flags().StringVar(&model, "model", "", "list only this model's endpoints")
	return cmd
}

// parseHashes parses 64-bit hex block hashes, with an optional 0x.
func parseHashes(args []string) ([]uint64, error) {
	out := make([]uint64, len(args))
	for i, a := range args {
		v, err := keyspace.ParseHashText(a)
		if err != nil {
			return nil, usagef("hash %d %q is not 64-bit hex (like e5068d13bba8906f, optionally 0x-prefixed)", i+1, a)
		}
		out[i] = v
	}
	return out, nil
}

// parseEndpoints parses POD or POD#RANK (a pod name may itself contain
// '#'; the last one followed by digits is the rank).
func parseEndpoints(specs []string) ([]client.Endpoint, error) {
	out := make([]client.Endpoint, 0, len(specs))
	for _, s := range specs {
		ep := client.Endpoint{Pod: s}
		if i := strings.LastIndexByte(s, '#'); i > 0 {
			if r, err := strconv.ParseUint(s[i+1:], 10, 32); err == nil {
				ep = client.Endpoint{Pod: s[:i], DPRank: uint32(r)}
			}
		}
		if ep.Pod == "" {
			return nil, usagef("--candidate %q: empty pod", s)
		}
		out = append(out, ep)
	}
	return out, nil
}

// parseBarriers parses TOPIC/PARTITION@OFFSET.
func parseBarriers(specs []string) ([]client.PartitionOffset, error) {
	out := make([]client.PartitionOffset, 0, len(specs))
	for _, s := range specs {
		at := strings.LastIndexByte(s, '@')
		slash := strings.LastIndexByte(s, '/')
		if at < 0 || slash < 0 || slash > at {
			return nil, usagef("--after %q: want TOPIC/PARTITION@OFFSET", s)
		}
		p, err1 := strconv.ParseInt(s[slash+1:at], 10, 32)
		o, err2 := strconv.ParseInt(s[at+1:], 10, 64)
		if err := errors.Join(err1, err2); err != nil || slash == 0 {
			return nil, usagef("--after %q: want TOPIC/PARTITION@OFFSET", s)
		}
		if p < 0 || o < 0 {
			return nil, usagef("--after %q: the partition and the offset are 0 or more", s)
		}
		if err := common.ValidateTopic(s[:slash]); err != nil {
			return nil, usagef("--after %q: %v", s, err)
		}
		out = append(out, client.PartitionOffset{Topic: s[:slash], Partition: int32(p), Offset: o})
	}
	return out, nil
}

type lookupJSON struct {
	Endpoints []matchJSON      `json:"endpoints"`
	Revision  int64            `json:"revision"`
	Offsets   map[string]int64 `json:"offsets"`
}

type matchJSON struct {
	Pod       string   `json:"pod"`
	DPRank    uint32   `json:"dp_rank"`
	Blocks    int      `json:"blocks"`
	BlockSize int      `json:"block_size"`
	Tiers     []string `json:"tiers"`
}

func partitionName(o client.PartitionOffset) string {
	return o.Topic + "/" + strconv.FormatInt(int64(o.Partition), 10)
}

func writeLookupJSON(w io.Writer, res *client.LookupResult) error {
	out := lookupJSON{Endpoints: []matchJSON{}, Revision: res.Revision, Offsets: map[string]int64{}}
	for _, m := range res.Matches {
		ts := make([]string, len(m.Tiers))
		for i, t := range m.Tiers {
			ts[i] = t.String()
		}
		out.Endpoints = append(out.Endpoints, matchJSON{Pod: m.Endpoint.Pod, DPRank: m.Endpoint.DPRank, Blocks: m.Blocks, BlockSize: m.BlockSize, Tiers: ts})
	}
	for _, o := range res.AppliedOffsets {
		out.Offsets[partitionName(o)] = o.Offset
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// tokenView is what a lookup asked: hashes block hashes (0 for a token
// Lookup), keyed here at blockSize from tokens token ids when --tokens
// gave them. none, called only when nothing matched, says why (noMatch);
// nil prints that no endpoint holds the first block.
type tokenView struct {
	hashes, blockSize, tokens int
	none                      func() string
}

// blocks renders a match's blocks as "matched/asked" and, when the
// lookup was by tokens, the prompt tokens that covers.
func (v tokenView) blocks(m client.Match) (string, string) {
	switch {
	case v.tokens == 0:
		return fmt.Sprintf("%d/%d", m.Blocks, v.hashes), "-"
	case v.hashes > 0: // keyed here at --block-size
		return fmt.Sprintf("%d/%d", m.Blocks, v.hashes), fmt.Sprintf("%d/%d", m.Blocks*v.blockSize, v.tokens)
	case m.BlockSize > 0:
		return fmt.Sprintf("%d/%d", m.Blocks, v.tokens/m.BlockSize), fmt.Sprintf("%d/%d", m.Blocks*m.BlockSize, v.tokens)
	}
	return strconv.Itoa(m.Blocks), "-"
}

func writeLookupTable(w io.Writer, res *client.LookupResult, v tokenView) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tDP_RANK\tBLOCKS\tBLOCK_SIZE\tTOKENS\tTIERS")
	for _, m := range res.Matches {
		blocks, toks := v.blocks(m)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\n", common.Display(m.Endpoint.Pod), m.Endpoint.DPRank, blocks, m.BlockSize, toks, tier.FormatRuns(m.Tiers))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(res.Matches) == 0 {
		line := "(no endpoint holds the first block)"
		if v.none != nil {
			line = v.none()
		}
		fmt.Fprintln(w, line)
	}
	offs := make([]string, len(res.AppliedOffsets))
	for i, o := range res.AppliedOffsets {
		offs[i] = common.Display(partitionName(o)) + "=" + strconv.FormatInt(o.Offset, 10)
	}
	_, err := fmt.Fprintf(w, "revision %d; applied offsets: %s\n", res.Revision, strings.Join(offs, " "))
	return err
}

type endpointsJSON struct {
	Endpoints   []endpointJSON `json:"endpoints"`
	Revision    int64          `json:"revision"`
	MaxRevision int64          `json:"max_revision"`
}

type endpointJSON struct {
	Model      string     `json:"model"`
	Pod        string     `json:"pod"`
	DPRank     uint32     `json:"dp_rank"`
	GPUBlocks  uint64     `json:"gpu_blocks"`
	CPUBlocks  uint64     `json:"cpu_blocks"`
	DiskBlocks uint64     `json:"disk_blocks"`
	BlockSize  uint32     `json:"block_size"`
	HashMode   string     `json:"hash_mode"`
	Partition  int32      `json:"partition"`
	LastSeen   *time.Time `json:"last_seen"`
}

func writeEndpointsJSON(w io.Writer, list *client.EndpointList) error {
	out := endpointsJSON{Endpoints: []endpointJSON{}, Revision: list.Revision, MaxRevision: list.MaxRevision}
	for _, e := range list.Endpoints {
		j := endpointJSON{Model: e.Model, Pod: e.Endpoint.Pod, DPRank: e.Endpoint.DPRank, GPUBlocks: e.GPUBlocks,
			CPUBlocks: e.CPUBlocks, DiskBlocks: e.DiskBlocks, BlockSize: e.BlockSize, HashMode: e.HashMode.String(), Partition: e.Partition}
		if !e.LastSeen.IsZero() {
			t := e.LastSeen.UTC()
			j.LastSeen = &t
		}
		out.Endpoints = append(out.Endpoints, j)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func writeEndpointsTable(w io.Writer, list *client.EndpointList) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tPOD\tDP_RANK\tGPU\tCPU\tDISK\tBLOCK_SIZE\tHASH_MODE\tPARTITION\tLAST_SEEN")
	for _, e := range list.Endpoints {
		seen := "-"
		if !e.LastSeen.IsZero() {
			seen = e.LastSeen.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s\n", common.Display(e.Model), common.Display(e.Endpoint.Pod), e.Endpoint.DPRank,
			e.GPUBlocks, e.CPUBlocks, e.DiskBlocks, e.BlockSize, e.HashMode, e.Partition, seen)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if list.MaxRevision > list.Revision {
		_, err := fmt.Fprintf(w, "%d endpoints in %d pages at revisions %d to %d (each page reflects one revision)\n",
			len(list.Endpoints), list.Pages, list.Revision, list.MaxRevision)
		return err
	}
	_, err := fmt.Fprintf(w, "%d endpoints at revision %d\n", len(list.Endpoints), list.Revision)
	return err
}
