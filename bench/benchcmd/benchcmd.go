// Package benchcmd wires `kvindex-bench fleet|ingest|lookup|coldstart`
// (cmd/kvindex-bench), the measuring instruments of package bench: each
// runs the whole pipeline (or the part it measures) inside this process,
// prints a table of figures, each next to the reference measured in the same run and the
// DESIGN goal it is held to, and with -o json one JSON object per figure
// per line. --quick runs a small variant (under 30 s) that CI uses to
// check the commands work; its figures are not the ones BENCHMARKS.md
// quotes.
package benchcmd

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/bench"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/fleetsim"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

// errUsage marks bad command-line input.
var errUsage = errors.New("usage")

func usagef(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUsage}, args...)...)
}

// shared holds the flags every bench subcommand takes.
type shared struct {
	log        common.Logging
	quick      bool
	output     string
	trace      string
	cpuprofile string
}

func (s *shared) register(fs *pflag.FlagSet) {
	s.log.Register(fs)
	// Components log at info as they start and stop; a benchmark's output
	// is its table, so the default here is warn.
	if f := fs.Lookup("log-level"); f != nil {
		f.DefValue = "warn"
		_ = f.Value.Set("warn")
	}
	fs.BoolVar(&s.quick, "quick", false, "run a small variant (under 30 s on 2 cores): smoke-tests the command, not the figures")
	fs.StringVarP(&s.output, "output", "o", "text", "output: text (a table) or json (one object per figure per line)")
	fs.StringVar(&s.trace, "trace", "", "Mooncake request trace (JSON lines with hash_ids); default: the bundled "+
		bench.BundledTrace+" (a copy of ../shared/data/mooncake/conversation_trace.jsonl), found by walking up from the working directory, so run inside a clone")
	fs.StringVar(&s.cpuprofile, "cpuprofile", "", "write a CPU profile (pprof) of the measured run to this file")
}

func (s *shared) check() error {
	if s.output != "text" && s.output != "json" {
		return usagef("-o %q: want text or json", s.output)
	}
	return nil
}

// begin sets each flag of quick to its value when --quick is given and
// the flag was not, then checks the shared flags.
func (s *shared) begin(fs *pflag.FlagSet, quick map[string]string) error {
	for name, v := range quick {
		if err := quickDefault(fs, s.quick, name, v); err != nil {
			return err
		}
	}
	return s.check()
}

// inputs returns what every subcommand starts from: its logger and the
// request trace.
func (s *shared) inputs() (*slog.Logger, []fleetsim.Request, error) {
	log, err := s.log.Logger()
	if err != nil {
		return nil, nil, err
	}
	trace, err := bench.LoadTrace(s.trace)
	if err != nil {
		return nil, nil, err
	}
	return log, trace, nil
}

// write prints the report in the chosen format.
func (s *shared) write(w io.Writer, r *bench.Report) error {
	if s.output == "json" {
		return r.WriteJSON(w)
	}
	return r.WriteText(w)
}

// profile starts the CPU profile when asked; the returned function stops
// it. For commands that profile their whole run.
func (s *shared) profile() (func() error, error) {
	if s.cpuprofile == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(s.cpuprofile)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// quickDefault sets flag name to value when --quick is given and the flag
// was not.
func quickDefault(fs *pflag.FlagSet, quick bool, name, value string) error {
	if !quick || fs.Changed(name) {
		return nil
	}
	return fs.Set(name, value)
}

// NewCommand returns the root command of `kvindex-bench` with its
// subcommands. It prints neither usage nor the error on failure: main
// prints the error once.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "kvindex-bench",
		Short:         "Measure kvindex against the performance goals of DESIGN",
		SilenceUsage:  true,
		SilenceErrors: true,
		Long: `kvindex-bench runs kvindex's measuring instruments inside this process (embedded
etcd with fsync on unless --fsync=false, the kfake Kafka broker, ingesters, indexd replicas,
the load generator, all sharing the machine's cores) and prints each figure
next to a reference measured in the same run: the machines are shared and
noisy, so the ratios are what a goal is held to. BENCHMARKS.md records the
figures and the commands that produced them.

The workload is a Mooncake request trace (each request's hash_ids are its
prefix blocks); by default the bundled testdata/mooncake/conversation_trace.jsonl,
a copy of ../shared/data/mooncake/conversation_trace.jsonl, found from the
working directory upwards (run inside a clone, or pass --trace).

Every subcommand takes --quick (a small run, under 30 s, for CI) and
-o json (one JSON object per figure per line:
  {"figure", "value", "unit", "reference", "ratio", "goal", "met", ...}
with null where a figure has no reference or goal).`,
	}
	cmd.AddCommand(newFleetCommand(), newIngestCommand(), newLookupCommand(), newColdStartCommand())
	return cmd
}

// parseCounts parses a comma-separated list of positive counts; k and M
// suffixes multiply by 1,000 and 1,000,000.
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		mult := 1
		switch {
		case strings.HasSuffix(part, "M"):
			mult, part = 1_000_000, strings.TrimSuffix(part, "M")
		case strings.HasSuffix(part, "k"):
			mult, part = 1_000, strings.TrimSuffix(part, "k")
		}
		n, err := strconv.Atoi(part)
		if err != nil || n <= 0 {
			return nil, usagef("%q: want positive counts, comma separated (k and M suffixes allowed)", s)
		}
		out = append(out, n*mult)
	}
	return out, nil
}

func newFleetCommand() *cobra.Command {
	var (
		s            shared
		stream       = bench.DefaultStreamConfig()
		partitions   int32
		fraction     float64
		rate         float64
		duration     time.Duration
		probeEvery   int
		ceilProbe    int
		maxInFlight  int
		windowOps    int
		maxTxnOps    int
		txnsInFlight int
		setup        setupFlags
	)
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "End-to-end rate, freshness and etcd cost per block op of a simulated fleet, against the v1 layout",
		Long: `fleet drives the whole pipeline (Kafka → ingester → etcd → two indexd
replicas) with the KV events of a simulated fleet of --endpoints model
servers serving the trace: requests go round-robin, each endpoint keeps an
LRU GPU cache of --gpu-blocks blocks with an LRU CPU tier of --cpu-blocks
behind it, and publishes the vLLM BlockStored/BlockRemoved batches those
caches emit.

It first measures two raw block-op ceilings, each on a fresh etcd: the
stream's etcd transactions, captured from one ingester run, written
straight to etcd by one writer per partition; and the v1 layout's
transactions for the same records (one key per block, the same windows
and transaction bound) written the same way. Then, on a fresh pipeline, a
token-bucket pacer produces the batches at --rate block-ops/s (DESIGN's
goal: 50000), or when --rate is 0 at --fraction of the first ceiling (a
negative --fraction produces as fast as the pipeline takes them); with
--duration the stream is cut to the batches the pacer hands out in that
time, and every part of the run works on those. For every
--probe-every-th batch, a Lookup on the second replica with a
read-your-events barrier on the produced record returns when it is
visible there: its freshness is the time from handing the batch to the
producer to that answer. Last, the same pipeline unpaced (probing every
--ceiling-probe-every-th batch) gives the end-to-end ceiling.

Reported: events/s and block-ops/s of the paced run, freshness p50/p99/max
and its stages; etcd ops per block op (the ingester's transactions' ops,
goal ≤ 0.1), etcd DB growth per block op (dbSizeInUse from etcd's
Maintenance Status, before and after) against the v1 layout's (goal ≤
0.25×), watch bytes per block op (a dedicated watcher of the keyspace,
protobuf size of each event's KeyValue); the ceilings, and the end-to-end
ceiling against the v1 layout's raw ceiling (goal ≥ 5×). Every rate and
every per-block-op figure counts the stream's block ops as published.
Freshness goal: p99 ≤ 50 ms at half the ceiling (DESIGN) or at a fixed
50000 block-ops/s or more (DESIGN). --cpuprofile profiles the paced run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := s.begin(cmd.Flags(), map[string]string{"requests": "1500"}); err != nil {
				return err
			}
			if duration < 0 || (duration != 0 && rate <= 0) {
				return usagef("--duration %s needs --rate (and a positive duration)", duration)
			}
			bs, err := setup.setup()
			if err != nil {
				return err
			}
			log, trace, err := s.inputs()
			if err != nil {
				return err
			}
			st, err := bench.BuildStream(trace, stream)
			if err != nil {
				return err
			}
			cfg := bench.FleetConfig{Stream: st, Partitions: partitions, Fraction: fraction, Rate: rate, Duration: duration,
				ProbeEvery: probeEvery, CeilingProbeEvery: ceilProbe, MaxInFlight: maxInFlight, WindowOps: windowOps, MaxTxnOps: maxTxnOps, MaxTxnsInFlight: txnsInFlight, Setup: bs, Logger: log}
			if s.cpuprofile != "" {
				f, err := os.Create(s.cpuprofile)
				if err != nil {
					return err
				}
				defer f.Close()
				cfg.Profile = f
			}
			res, err := bench.RunFleet(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			r := &bench.Report{Title: "kvindex-bench fleet"}
			r.Add(res.Figures()...)
			r.Notef("stream: %d requests on %d endpoints (GPU %d blocks, CPU %d): %d batches, %d events, %d block ops, %.1f MB; cache hits GPU %d, CPU %d, misses %d",
				st.Stats.Requests, stream.Endpoints, stream.GPUBlocks, stream.CPUBlocks, len(st.Records), st.Events, st.BlockOps, float64(st.Bytes)/1e6,
				st.Stats.GPUHits, st.Stats.CPUHits, st.Stats.Misses)
			if res.Records < len(st.Records) {
				r.Notef("--duration %s at %.0f block-ops/s: the run's stream is the first %d batches, %d events, %d block ops",
					duration, rate, res.Records, res.Events, res.BlockOps)
			}
			r.Notef("ceiling (%s transactions, captured): %d transactions of %d ops, %d of them on data keys, written in %s by %d writers; etcd DB grew %d B (in use %d B)",
				res.Captured.Layout, res.Captured.Txns, res.Captured.Ops, res.Captured.DataOps, res.CeilingTime.Round(time.Millisecond), res.Partitions, res.CeilingDB.Size, res.CeilingDB.InUse)
			var shares []string
			for _, w := range res.CeilingWriters {
				shares = append(shares, fmt.Sprintf("partition %d: %d data ops in %s", w.Partition, w.Ops, w.Time.Round(time.Millisecond)))
			}
			r.Notef("ceiling writers: %s", strings.Join(shares, "; "))
			r.Notef("v1 layout: %d windows, %d transactions of %d ops, %d block ops after coalescing (%d not keyed), written in %s; etcd DB grew %d B (in use %d B)",
				res.V1.Windows, res.V1.Txns, res.V1.Ops, res.V1.BlockOps, res.V1.Unkeyed, res.V1Time.Round(time.Millisecond), res.V1DB.Size, res.V1DB.InUse)
			p := &res.Paced
			if res.TargetRate > 0 {
				r.Notef("paced at %.0f block-ops/s (%.3g of the ceiling); the run took %s", res.TargetRate, res.Fraction, p.Elapsed.Round(time.Millisecond))
			} else {
				r.Notef("unpaced (at most %d batches in flight); the run took %s", cfg.MaxInFlight, p.Elapsed.Round(time.Millisecond))
			}
			r.Notef("paced run: the ingester wrote %d transactions of %d ops; etcd DB grew %d B (in use %d B); the watcher received %d events, %d B of KeyValues",
				p.Txns, p.Ops, p.DB.Size, p.DB.InUse, p.WatchEvents, p.WatchBytes)
			r.Notef("freshness probes: %d, of which %d showed the batch's endpoint; pacer stalls at the in-flight bound: %d",
				len(p.Freshness.Sorted), p.Visible, p.Stalls)
			for _, st := range []struct {
				name string
				l    bench.Latencies
			}{
				{"handed to the producer → acknowledged", p.Acks},
				{"acknowledged → the ingester sends the transaction storing its offset", p.Sent},
				{"sent → visible on the second replica", p.Shown},
			} {
				r.Notef("freshness stage %s: p50 %s, p99 %s, max %s", st.name, st.l.Percentile(0.5).Round(time.Microsecond),
					st.l.Percentile(0.99).Round(time.Microsecond), st.l.Max().Round(time.Microsecond))
			}
			r.Notef("unpaced end-to-end run: %s for %d block ops (%.0f block-ops/s), %d probes, p99 %s",
				res.E2E.Elapsed.Round(time.Millisecond), res.BlockOps, res.E2ERate(), len(res.E2E.Freshness.Sorted), res.E2E.Freshness.Percentile(0.99).Round(time.Microsecond))
			return s.write(cmd.OutOrStdout(), r)
		},
	}
	fs := cmd.Flags()
	s.register(fs)
	registerStream(fs, &stream)
	fs.Int32Var(&partitions, "partitions", 4, "partitions of the topic (one ingester worker and one reference writer each)")
	fs.Float64Var(&fraction, "fraction", 0.5, "target rate as a fraction of the measured raw block-op ceiling; negative: unpaced")
	fs.Float64Var(&rate, "rate", 0, "target rate in block-ops/s, a fixed pace (overrides --fraction when positive; DESIGN's goal: 50000)")
	fs.DurationVar(&duration, "duration", 0, "with --rate: cut the stream to the batches the pacer hands out in this time (0: the whole stream)")
	fs.IntVar(&probeEvery, "probe-every", 1, "probe the freshness of every n-th batch")
	fs.IntVar(&ceilProbe, "ceiling-probe-every", 64, "probe every n-th batch in the unpaced run that measures the end-to-end ceiling")
	fs.IntVar(&maxInFlight, "max-in-flight", 200, "batches produced but not yet confirmed before the pacer waits (keep it under indexd's --max-barrier-waiters, 256)")
	fs.IntVar(&windowOps, "window-ops", ingester.DefaultWindowOps, "the ingester's WindowOps: block operations that end a batch window")
	fs.IntVar(&maxTxnOps, "max-txn-ops", ingester.DefaultMaxTxnOps, "the ingester's --max-txn-ops, the most ops per transaction (it packs what etcd accepts, up to this; the embedded etcd takes 1024, as deploy/ runs it)")
	fs.IntVar(&txnsInFlight, "max-txns-in-flight", bench.DefaultTxnsInFlight, "the transactions each reference writer keeps in flight (the ingester writes a window in one transaction)")
	setup.register(fs)
	return cmd
}

// setupFlags are the flags of bench.Setup: how etcd and the ingesters run.
type setupFlags struct {
	hashMode     string
	fsync        bool
	chunkSize    int
	chunkOpenAt  int
	windowLinger time.Duration
	etcdCPUs     []int
}

func (f *setupFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.hashMode, "hash-mode", string(ingester.DefaultConfig().HashMode),
		"the ingesters' --hash-mode: token (blocks keyed from their token ids; the freshness probes look up token keys) or engine")
	fs.IntVar(&f.chunkSize, "chunk-size", ingester.DefaultConfig().ChunkSize, "the ingesters' --chunk-size: the most blocks of one chunk key (their --chunk-merge-below follows it, an eighth)")
	fs.IntVar(&f.chunkOpenAt, "chunk-open-at", 0, "the ingesters' --chunk-open-at: a record's first new block in a tier opens a new chunk when the newest already holds this many, or the merge threshold for a record storing --chunk-size/8 there (0: their default, --chunk-size with a linger, else 3/4 of it; --chunk-size: only when full)")
	fs.DurationVar(&f.windowLinger, "window-linger", ingester.DefaultWindowLinger, "the ingesters' --window-linger: a window that is not full stays open until its oldest record is this old (0: none)")
	fs.BoolVar(&f.fsync, "fsync", true, "run etcd with fsync on, as every deployment does; --fsync=false only to compare with figures measured without it")
	fs.IntSliceVar(&f.etcdCPUs, "etcd-cpus", nil, "run each etcd in a child process pinned to these CPUs (Linux), and everything else on the other CPUs, as etcd runs on machines of its own when deployed (empty: etcd shares every core; figures carry the label etcd_cpus)")
}

// setup checks the flags and returns their bench.Setup; with --etcd-cpus
// it also pins this process to the CPUs left outside etcd
// (bench.PinOutsideEtcd), so call it before the benchmark starts.
func (f *setupFlags) setup() (bench.Setup, error) {
	m, err := keyspace.ParseHashMode(f.hashMode)
	if err != nil {
		return bench.Setup{}, usagef("--hash-mode: %v", err)
	}
	if f.chunkSize < 1 || f.chunkSize > keyspace.MaxChunkEntries {
		return bench.Setup{}, usagef("--chunk-size %d: want between 1 and %d", f.chunkSize, keyspace.MaxChunkEntries)
	}
	if f.chunkOpenAt < 0 || f.chunkOpenAt > f.chunkSize {
		return bench.Setup{}, usagef("--chunk-open-at %d: want between 1 and --chunk-size %d, or 0 for the default", f.chunkOpenAt, f.chunkSize)
	}
	if f.windowLinger < 0 || f.windowLinger > time.Second {
		return bench.Setup{}, usagef("--window-linger %v: want between 0 and 1s", f.windowLinger)
	}
	linger := f.windowLinger
	if linger == 0 {
		linger = -1 // bench.Setup: none
	}
	out := bench.Setup{HashMode: m, NoFsync: !f.fsync, ChunkSize: f.chunkSize, ChunkOpenAt: f.chunkOpenAt, WindowLinger: linger, EtcdCPUs: f.etcdCPUs}
	if _, err := bench.PinOutsideEtcd(out); err != nil {
		return bench.Setup{}, usagef("--etcd-cpus: %v", err)
	}
	return out, nil
}

// registerStream adds the fleet simulation's flags.
func registerStream(fs *pflag.FlagSet, c *bench.StreamConfig) {
	fs.IntVar(&c.Endpoints, "endpoints", c.Endpoints, "simulated model-server endpoints")
	fs.IntVar(&c.GPUBlocks, "gpu-blocks", c.GPUBlocks, "LRU GPU cache per endpoint, in blocks")
	fs.IntVar(&c.CPUBlocks, "cpu-blocks", c.CPUBlocks, "LRU CPU tier per endpoint, in blocks (-1: none)")
	fs.IntVar(&c.Requests, "requests", 0, "trace requests to serve, from the start (0: all; --quick: 1500)")
}

func newIngestCommand() *cobra.Command {
	var (
		s            shared
		stream       = bench.DefaultStreamConfig()
		partitions   int32
		maxTxnOps    int
		windowOps    int
		txnsInFlight int
		rounds       int
		setup        setupFlags
	)
	cmd := &cobra.Command{
		Use:   "ingest",
		Short: "Ingest block-ops/s against the same transactions written straight to etcd, and the v1 layout's",
		Long: `ingest produces the fleet's event stream (see 'kvindex-bench fleet') into a
topic before anything is timed, then measures block operations per second
through Kafka → ingester → etcd against the raw limit measured in the same
run: the same etcd transactions (captured from an ingester run) written
straight to a fresh etcd by the same number of concurrent writers (one per
partition). Beside them, the v1 layout's transactions for the same records
(one key per block, the same windows, --max-txn-ops per transaction) are
written the same way: the raw limit of the ingester's layout against v1's.
Rounds rotate which of the three goes first; each run gets a fresh etcd.
Rates count the stream's block ops as published. DESIGN's goal: ingest ≥
80% of the raw limit.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := s.begin(cmd.Flags(), map[string]string{"requests": "1500", "rounds": "1"}); err != nil {
				return err
			}
			bs, err := setup.setup()
			if err != nil {
				return err
			}
			log, trace, err := s.inputs()
			if err != nil {
				return err
			}
			st, err := bench.BuildStream(trace, stream)
			if err != nil {
				return err
			}
			stop, err := s.profile()
			if err != nil {
				return err
			}
			res, err := bench.RunIngest(cmd.Context(), bench.IngestConfig{Stream: st, Partitions: partitions, MaxTxnOps: maxTxnOps, WindowOps: windowOps, MaxTxnsInFlight: txnsInFlight, Rounds: rounds, Setup: bs, Logger: log})
			if perr := stop(); err == nil {
				err = perr
			}
			if err != nil {
				return err
			}
			r := &bench.Report{Title: "kvindex-bench ingest"}
			r.Add(res.Figures()...)
			r.Notef("stream: %d batches, %d events, %d block ops, %.1f MB, from %d requests on %d endpoints",
				len(st.Records), st.Events, st.BlockOps, float64(st.Bytes)/1e6, st.Stats.Requests, stream.Endpoints)
			r.Notef("per round: %d captured %s transactions of %d ops, %d on data keys; v1 layout: %d transactions of %d ops, %d block ops after coalescing (%d not keyed)",
				res.Captured.Txns, res.Captured.Layout, res.Captured.Ops, res.Captured.DataOps, res.V1.Txns, res.V1.Ops, res.V1.BlockOps, res.V1.Unkeyed)
			r.Notef("summed over %d rounds: ingest %s (steady %s), reference %s, v1 layout %s",
				res.Rounds, res.IngestTime.Round(time.Millisecond), res.SteadyTime.Round(time.Millisecond),
				res.RefTime.Round(time.Millisecond), res.V1Time.Round(time.Millisecond))
			return s.write(cmd.OutOrStdout(), r)
		},
	}
	fs := cmd.Flags()
	s.register(fs)
	registerStream(fs, &stream)
	fs.Int32Var(&partitions, "partitions", 4, "partitions of the topic (ingester workers and reference writers)")
	fs.IntVar(&maxTxnOps, "max-txn-ops", ingester.DefaultMaxTxnOps, "the ingester's --max-txn-ops, the most ops per transaction (it packs what etcd accepts, up to this)")
	fs.IntVar(&windowOps, "window-ops", ingester.DefaultWindowOps, "the ingester's WindowOps: block operations that end a batch window")
	fs.IntVar(&txnsInFlight, "max-txns-in-flight", bench.DefaultTxnsInFlight, "the transactions each reference writer keeps in flight (the ingester writes a window in one transaction)")
	fs.IntVar(&rounds, "rounds", 3, "rounds of the reference, the v1 layout and the timed ingest, rotating their order (--quick: 1)")
	setup.register(fs)
	return cmd
}

func newLookupCommand() *cobra.Command {
	var (
		s           shared
		entries     string
		endpoints   int
		minTime     time.Duration
		concurrency int
		grpcTime    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "lookup",
		Short: "Lookup cost per hash against a bare map probe, index memory, gRPC latency",
		Long: `lookup builds, for each --entries size, an index of that many (block,
endpoint, tier) entries from the trace: salted copies of it served
round-robin by --endpoints endpoints that never evict, so prefix sharing is
the trace's. It reports the index's live heap per entry (goal ≤ 48 B),
then looks up every trace request in process, timing each Lookup and, in
the same loop, a bare Go map probe over the same keys (goal: Lookup ≤ 2×
the probe per hash), then serves the index from an indexd replica and
calls Lookup over loopback gRPC from --concurrency callers for --grpc-time,
against a gRPC health Check (a round trip that does no work) in the same
run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := s.begin(cmd.Flags(), map[string]string{"entries": "200k", "min-time": "500ms", "grpc-time": "1s"}); err != nil {
				return err
			}
			sizes, err := parseCounts(entries)
			if err != nil {
				return err
			}
			log, trace, err := s.inputs()
			if err != nil {
				return err
			}
			stop, err := s.profile()
			if err != nil {
				return err
			}
			res, err := bench.RunLookup(cmd.Context(), bench.LookupConfig{Trace: trace, Entries: sizes, Endpoints: endpoints,
				MinTime: minTime, Concurrency: concurrency, GRPCTime: grpcTime, Logger: log})
			if perr := stop(); err == nil {
				err = perr
			}
			if err != nil {
				return err
			}
			r := &bench.Report{Title: "kvindex-bench lookup"}
			for _, x := range res {
				r.Add(x.Figures()...)
				r.Notef("%d entries: %d distinct blocks; %d trace requests looked up, %d Lookups in all; gRPC: %d Lookups, %d health Checks",
					x.Entries, x.Blocks, x.Queries, x.Steps, len(x.GRPC.Sorted), len(x.Health.Sorted))
			}
			return s.write(cmd.OutOrStdout(), r)
		},
	}
	fs := cmd.Flags()
	s.register(fs)
	fs.StringVar(&entries, "entries", "1M,5M,10M", "index sizes in entries, comma separated (--quick: 200k)")
	fs.IntVar(&endpoints, "endpoints", 16, "endpoints holding the entries")
	fs.DurationVar(&minTime, "min-time", 2*time.Second, "least time of the in-process comparison per size (every request is looked up at least once; --quick: 500ms)")
	fs.IntVar(&concurrency, "concurrency", 8, "concurrent gRPC callers")
	fs.DurationVar(&grpcTime, "grpc-time", 3*time.Second, "duration of each gRPC measurement per size (--quick: 1s)")
	return cmd
}

func newColdStartCommand() *cobra.Command {
	var (
		s         shared
		entries   string
		endpoints int
		rounds    int
		quota     int64
		hashMode  string
		chunkSize int
	)
	cmd := &cobra.Command{
		Use:   "coldstart",
		Short: "Time for a fresh indexd to be ready against one unpaged Get of the same keys, with the v1 layout beside it",
		Long: `coldstart loads two embedded etcds with the same --entries entries from the
trace (GPU tier, over --endpoints endpoints with their records): one in
the v2 layout, as the ingester writes it (each endpoint's blocks in
insertion order in chunks of --chunk-size), the other in the v1 layout
(one key per block). Then it runs --rounds rounds of, each on a fresh
client: one unpaged Get of the v1 blocks/ prefix; the v1 reader's list of
it (records first, then keys-only ranges per endpoint, four at a time);
one unpaged Get of the v2 chunks/ prefix, the reference; and a fresh
indexd replica on the v2 etcd from start to gRPC health SERVING. Figures
are medians. DESIGN's goal: ready ≤ 1.25× the unpaged Get. --hash-mode
token (the ingester's default) gives 16-byte chunk entries and v1 values
of the engine hash; engine gives 8-byte entries and empty v1 values. Each
etcd's quota is raised to --quota-bytes for millions of keys.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := s.begin(cmd.Flags(), map[string]string{"entries": "200k", "rounds": "1"}); err != nil {
				return err
			}
			sizes, err := parseCounts(entries)
			if err != nil {
				return err
			}
			if len(sizes) != 1 {
				return usagef("--entries %q: want one count", entries)
			}
			mode, err := keyspace.ParseHashMode(hashMode)
			if err != nil {
				return usagef("--hash-mode: %v", err)
			}
			log, trace, err := s.inputs()
			if err != nil {
				return err
			}
			stop, err := s.profile()
			if err != nil {
				return err
			}
			res, err := bench.RunColdStart(cmd.Context(), bench.ColdStartConfig{Trace: trace, Entries: sizes[0], Endpoints: endpoints,
				HashMode: mode, ChunkSize: chunkSize, Rounds: rounds, QuotaBytes: quota, Logger: log})
			if perr := stop(); err == nil {
				err = perr
			}
			if err != nil {
				return err
			}
			r := &bench.Report{Title: "kvindex-bench coldstart"}
			r.Add(res.Figures()...)
			r.Notef("%d entries on %d endpoints (%s mode): %d v2 chunks loaded in %s, v1 block keys in %s",
				res.Entries, res.Endpoints, res.HashMode, res.Chunks, res.LoadV2.Round(time.Millisecond), res.LoadV1.Round(time.Millisecond))
			r.Notef("per round: v2 Get %v (%d B), indexd ready %v; v1 Get %v (%d B), v1 list %v",
				rounded(res.Get), res.GetBytes, rounded(res.Ready), rounded(res.V1Get), res.V1GetBytes, rounded(res.V1List))
			return s.write(cmd.OutOrStdout(), r)
		},
	}
	fs := cmd.Flags()
	s.register(fs)
	fs.StringVar(&entries, "entries", "5M", "(block, endpoint, tier) entries each etcd holds (--quick: 200k)")
	fs.IntVar(&endpoints, "endpoints", 16, "endpoints holding them")
	fs.IntVar(&rounds, "rounds", 3, "rounds; figures are medians (--quick: 1)")
	fs.Int64Var(&quota, "quota-bytes", 8<<30, "each embedded etcd's --quota-backend-bytes")
	fs.StringVar(&hashMode, "hash-mode", string(ingester.DefaultConfig().HashMode), "the endpoints' hash mode: token (16-byte chunk entries) or engine (8-byte)")
	fs.IntVar(&chunkSize, "chunk-size", keyspace.DefaultChunkSize, "entries per v2 chunk")
	return cmd
}

func rounded(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
