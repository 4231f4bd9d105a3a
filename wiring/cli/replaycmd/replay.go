// Package replaycmd wires `kvindex replay FILE...`: it runs scenario files
// (testdata/fixtures/README.md) through a kvindex pipeline and checks every
// lookup step. With neither --brokers nor --index it starts a fresh
// embedded stack for each file (each scenario starts from an empty index);
// with both it targets a running deployment.
package replaycmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/kafkaauth"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/wiring/cli/common"
	"github.com/kvindex/kvindex/wiring/replay"
	"github.com/kvindex/kvindex/wiring/stack"
)

// exitError carries the exit code: 1 when an expectation fails, 2 for bad
// usage. The root command turns it into the process's exit status.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }
func (e *exitError) ExitCode() int { return e.code }

type flags struct {
	log            common.Logging
	brokers        []string
	index          string
	topic          string
	barrierTimeout time.Duration
	output         string
	kafkaAuth      kafkaauth.Config
	indexTLS       common.ClientTLS
}

// NewCommand returns `kvindex replay`.
func NewCommand() *cobra.Command {
	var f flags
	cmd := &cobra.Command{
		Use:   "replay FILE...",
		Short: "Run scenario files through kvindex and check every lookup",
		Long: `replay produces each scenario's publish steps to Kafka and checks each lookup
step against indexd, waiting for the records with a read-your-events barrier
(never a sleep). It prints PASS or FAIL per file and, for a failure, the
step's line, what was expected and what came back; it exits 1 if any lookup
differs.

With neither --brokers nor --index, every file runs on a fresh embedded stack
(etcd, Kafka, ingester, indexd in this process), so each starts from an empty
index. With both, files run against that deployment, whose index must not
already hold the scenarios' models; the --kafka-tls-*, --kafka-sasl-* and
--tls-* flags then reach its Kafka and indexd as the roles' flags do.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(cmd.Context(), cmd.OutOrStdout(), &f, args)
		},
	}
	fs := cmd.Flags()
	f.log.Register(fs)
	fs.StringSliceVar(&f.brokers, "brokers", nil, "Kafka seed brokers of a running deployment (with --index)")
	fs.StringVar(&f.index, "index", "", "indexd address of a running deployment (with --brokers)")
	fs.StringVar(&f.topic, "topic", contract.DefaultTopic, "Kafka topic the deployment's ingesters consume")
	fs.DurationVar(&f.barrierTimeout, "barrier-timeout", replay.DefaultBarrierTimeout, "how long a lookup step waits for the records before it")
	fs.StringVarP(&f.output, "output", "o", "text", "output: text or json (one object per file)")
	f.kafkaAuth.Register(fs)
	f.indexTLS.Register(fs)
	return cmd
}

func run(ctx context.Context, out io.Writer, f *flags, files []string) error {
	if err := common.ValidateTopic(f.topic); err != nil {
		return &exitError{2, fmt.Errorf("--topic: %w", err)}
	}
	if f.barrierTimeout <= 0 {
		return &exitError{2, fmt.Errorf("--barrier-timeout must be positive, got %s", f.barrierTimeout)}
	}
	if (len(f.brokers) == 0) != (f.index == "") {
		return &exitError{2, errors.New("--brokers and --index go together (give both to target a deployment, neither for an embedded stack)")}
	}
	if len(f.brokers) == 0 && (f.kafkaAuth != (kafkaauth.Config{}) || f.indexTLS != (common.ClientTLS{})) {
		return &exitError{2, errors.New("the --kafka-tls-*, --kafka-sasl-* and --tls-* flags need --brokers and --index (the embedded stack is plaintext)")}
	}
	if err := f.kafkaAuth.Validate(); err != nil {
		return &exitError{2, err}
	}
	if err := (&common.Kafka{Brokers: f.brokers}).ValidateBrokers(); err != nil {
		return &exitError{2, err}
	}
	if f.output != "text" && f.output != "json" {
		return &exitError{2, fmt.Errorf("--output %q: want text or json", f.output)}
	}
	if _, err := f.log.LoggerTo(io.Discard); err != nil {
		return &exitError{2, err} // before any file: the flag's, not a scenario's
	}
	var scenarios []*scenario.Scenario
	for _, path := range files {
		s, err := scenario.Load(path)
		if err != nil {
			return &exitError{2, err}
		}
		scenarios = append(scenarios, s)
	}
	failed := 0
	for _, s := range scenarios {
		res, err := runOne(ctx, f, s)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Path, err)
		}
		if len(res.Mismatches) > 0 {
			failed++
		}
		report(out, f.output, s, res)
	}
	if failed > 0 {
		return &exitError{1, fmt.Errorf("%d of %d scenarios failed", failed, len(scenarios))}
	}
	return nil
}

// brokerPingTimeout bounds the first contact with --brokers.
var brokerPingTimeout = 10 * time.Second

func runOne(ctx context.Context, f *flags, s *scenario.Scenario) (replay.Result, error) {
	brokers, index, topic := f.brokers, f.index, f.topic
	if f.index == "" {
		log, err := f.log.Logger()
		if err != nil {
			return replay.Result{}, err
		}
		if f.log.Level == "info" {
			log = logging.Discard() // the embedded stack's info logs would drown the report
		}
		dir, err := os.MkdirTemp("", "kvindex-replay-")
		if err != nil {
			return replay.Result{}, err
		}
		defer os.RemoveAll(dir)
		st, err := stack.Start(ctx, stack.Config{
			DataDir: dir, EtcdAddr: "127.0.0.1:0", KafkaAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
			Topic: topic, Keyspace: keyspace.Default(), UnsafeNoFsync: true, Logger: log,
			// Each file runs in its own hash mode.
			Ingester: func(c *ingester.Config) { c.HashMode = keyspace.HashMode(s.HashMode) },
		})
		if err != nil {
			return replay.Result{}, err
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- st.Run(runCtx) }()
		defer func() {
			cancel()
			<-done
		}()
		brokers, index = []string{st.KafkaAddr()}, st.GRPCAddr()
	}
	var kopts []kgo.Opt
	var copts []client.Option
	if len(f.brokers) > 0 {
		log, err := f.log.Logger()
		if err != nil {
			return replay.Result{}, err
		}
		if kopts, err = f.kafkaAuth.Opts(log); err != nil {
			return replay.Result{}, err
		}
		if copts, err = f.indexTLS.Options(); err != nil {
			return replay.Result{}, err
		}
	}
	prod, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.RecordRetries(10)}, kopts...)...)
	if err != nil {
		return replay.Result{}, err
	}
	defer prod.Close()
	if len(f.brokers) > 0 {
		// franz-go retries an unreachable broker for as long as the
		// records may wait: a dead --brokers would take the whole
		// barrier wait and more to say so.
		pctx, cancel := context.WithTimeout(ctx, brokerPingTimeout)
		err := prod.Ping(pctx)
		cancel()
		if err != nil {
			// Ping returns at once for a refused connection, and after
			// brokerPingTimeout for brokers that do not answer.
			return replay.Result{}, fmt.Errorf("the Kafka brokers %v did not answer (--brokers; tried for up to %s): %w", logging.RedactURLs(f.brokers), brokerPingTimeout, err)
		}
	}
	idx, err := client.New(index, append(copts, client.WithTimeout(f.barrierTimeout+10*time.Second))...)
	if err != nil {
		return replay.Result{}, err
	}
	defer idx.Close()
	target := replay.Target{Producer: prod, Topic: topic, Index: idx, BarrierTimeout: f.barrierTimeout}
	if f.index != "" {
		// A deployment runs in one hash mode: a file of the other would
		// fail every lookup, so it is refused before anything of it is
		// produced.
		mode, err := replay.HashMode(ctx, target, fmt.Sprintf("replay-probe-%d", os.Getpid()))
		if err != nil {
			return replay.Result{}, err
		}
		if mode != s.HashMode {
			return replay.Result{}, &exitError{2, fmt.Errorf("%w: the deployment's ingesters run --hash-mode %s, %s is a scenario of --hash-mode %s (start the stack with --hash-mode %s to replay it)",
				replay.ErrHashMode, mode, s.Path, s.HashMode, s.HashMode)}
		}
	}
	return replay.Run(ctx, target, s)
}

func report(out io.Writer, format string, s *scenario.Scenario, res replay.Result) {
	if format == "json" {
		type mismatch struct {
			Line     int              `json:"line"`
			Describe string           `json:"describe,omitempty"`
			Model    string           `json:"model"`
			Expected []scenario.Match `json:"expected"`
			Actual   []scenario.Match `json:"actual"`
			Diffs    []string         `json:"diffs"`
		}
		obj := struct {
			Scenario   string     `json:"scenario"`
			File       string     `json:"file"`
			Pass       bool       `json:"pass"`
			Publishes  int        `json:"publishes"`
			Lookups    int        `json:"lookups"`
			Mismatches []mismatch `json:"mismatches"`
			HeldBefore []string   `json:"held_before,omitempty"`
		}{Scenario: res.Scenario, File: s.Path, Pass: len(res.Mismatches) == 0, Publishes: res.Publishes, Lookups: res.Lookups, Mismatches: []mismatch{}, HeldBefore: res.HeldBefore}
		for _, m := range res.Mismatches {
			obj.Mismatches = append(obj.Mismatches, mismatch{m.Line, m.Describe, m.Model, m.Expected, m.Actual, m.Diffs})
		}
		b, _ := json.Marshal(obj)
		fmt.Fprintln(out, string(b))
		return
	}
	if len(res.Mismatches) == 0 {
		fmt.Fprintf(out, "PASS %s (%s, %s)\n", res.Scenario, count(res.Publishes, "record"), count(res.Lookups, "lookup"))
		return
	}
	fmt.Fprintf(out, "FAIL %s (%s)\n", res.Scenario, s.Path)
	for _, m := range res.Mismatches {
		if m.Tokens != nil {
			fmt.Fprintf(out, "  line %d: lookup %s of %d tokens (block size %d)", m.Line, m.Model, len(m.Tokens), m.BlockSize)
		} else {
			fmt.Fprintf(out, "  line %d: lookup %s of %d hashes", m.Line, m.Model, len(m.Hashes))
		}
		if m.Describe != "" {
			fmt.Fprintf(out, " (%s)", m.Describe)
		}
		fmt.Fprintln(out)
		fmt.Fprintf(out, "    expected: %s\n", render(m.Expected))
		fmt.Fprintf(out, "    actual:   %s\n", render(m.Actual))
		for _, d := range m.Diffs {
			fmt.Fprintf(out, "    - %s\n", d)
		}
	}
	if len(res.HeldBefore) > 0 {
		fmt.Fprintf(out, "  note: before its first step the index already held endpoints of %s; every scenario expects an empty index (replayed before? replay into a fresh stack)\n", strings.Join(res.HeldBefore, ", "))
	}
}

// count renders "1 lookup", "2 lookups", "0 lookups".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func render(ms []scenario.Match) string {
	if len(ms) == 0 {
		return "(no endpoint)"
	}
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%s#%d=%d", m.Pod, m.DPRank, m.Blocks)
		if len(m.Tiers) > 0 {
			parts[i] += "[" + strings.Join(m.Tiers, ",") + "]"
		}
	}
	return strings.Join(parts, " ")
}
