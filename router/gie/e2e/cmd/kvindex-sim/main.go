// Command kvindex-sim is kvindex's routing-quality simulator: it replays a
// Mooncake trace through GIE endpoint pickers (random, the approximate
// prefix producer, kvindex's producer, kvindex with its tier scorer) and
// an oracle, in front of simulated vLLM pods whose KV events go through the
// whole kvindex pipeline in process, and reports the hit rate each
// strategy gets against cache size. The work is package
// router/gie/e2e/internal/sim; this is its flags.
//
//	kvindex-sim [--quick] [-o text|json] [--report DIR] [flags]
//
// Run it from inside the kvindex repository (it finds the trace and the
// example configs there) or give --repo.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvindex/kvindex/bench"
	"github.com/kvindex/kvindex/router/gie/e2e/internal/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "kvindex-sim:", err)
		os.Exit(1)
	}
}

// run parses args, runs the simulation and writes its figures to stdout
// and its report to the report directory.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvindex-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := sim.DefaultConfig()
	quick := fs.Bool("quick", false, "the quick run (first 1500 requests, one cache size, 4 restarting routers; under 2 minutes)")
	output := fs.String("o", "text", "figures on stdout: text (a table) or json (one object per figure per line, as kvindex-bench -o json)")
	repo := fs.String("repo", "", "the kvindex repository (default: found from the working directory upward)")
	trace := fs.String("trace", "", "the trace, relative to the repository unless absolute (default "+def.TracePath+")")
	report := fs.String("report", "kvindex-sim-report", "directory for report.md and hit_rate.svg (empty: no report)")
	speedup := fs.Float64("speedup", 0, "divide the trace's time by this (default 20, quick 30)")
	fractions := fs.String("fractions", "", "cache fractions, comma-separated (default 0.05,0.1,0.2; quick 0.2)")
	routers := fs.String("routers", "", "router instance counts, comma-separated; with --restarts, runs every combination for every strategy (default: approx and kvindex with 1 router, 4 routers, and 4 restarting routers; kvindex-tier with 4 restarting routers; quick: 4 restarting routers)")
	restarts := fs.String("restarts", "", "restart settings, comma-separated booleans, crossed with --routers (default false,true when --routers is given)")
	restartEvery := fs.Int("restart-every", 0, "requests an instance takes before it restarts (default 2000, quick 300)")
	strategies := fs.String("strategies", "", "strategies, comma-separated (default all: "+strings.Join(sim.Strategies, ",")+")")
	pods := fs.Int("pods", 0, "simulated vLLM pods (default 8)")
	cpuRatio := fs.Float64("cpu-ratio", -1, "CPU tier size in GPU caches, 0 for none (default 1)")
	maxRequests := fs.Int("max-requests", -1, "keep the trace's first N requests, 0 for all (default all, quick 1500)")
	parallel := fs.Int("parallel", 0, "runs at once (default 4, quick 5)")
	seed := fs.Uint64("seed", 0, "seed of the engine hashes, tie breaks and arrival jitter (default 17)")
	orders := fs.Int("orders", 0, "arrival orders per cell: order 0 is the trace's own, the others jitter it (default 3, quick 1); tables report mean [min, max] over them")
	jitter := fs.Duration("jitter", 0, "a jittered order moves each request by a seeded uniform jitter of at most this, either way, in trace time, never before the previous request sharing its first two hash ids (default 1.5s)")
	allowInvalid := fs.Bool("allow-invalid", false, "exit 0 even when a run is not valid (a non-quick run that fell behind its schedule otherwise fails, after writing its figures and report)")
	loadWindow := fs.Int("load-window", -1, "load cap window in requests, 0 for no cap (default 200)")
	loadSlack := fs.Float64("load-slack", 0, "load cap: a pod may take this times its share of the window (default 1.5)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: kvindex-sim [--quick] [-o text|json] [--report DIR] [flags]\n\n"+
			"Replays a Mooncake trace through GIE endpoint pickers and an oracle in front of\n"+
			"simulated vLLM pods whose KV events go through the whole kvindex pipeline in\n"+
			"process, and reports each strategy's token-weighted hit rate by cache size, with\n"+
			"the trace's reuse ceiling (one pod, infinite cache), ghost routes, TTFT and\n"+
			"event lag for every cell, as mean [min, max] over the arrival orders.\n\n"+
			"A run is valid when its p99 lateness is at most 1%% of its trace span and its\n"+
			"effective speedup within 10%% of --speedup; every figure says so (label valid).\n"+
			"A run that is not --quick and not valid exits 1 after writing its figures and\n"+
			"report, unless --allow-invalid.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *output != "text" && *output != "json" {
		return fmt.Errorf("-o %q: want text or json", *output)
	}
	c := def
	if *quick {
		c = sim.QuickConfig()
	}
	root := *repo
	if root == "" {
		r, err := findRepo()
		if err != nil {
			return err
		}
		root = r
	}
	if *trace != "" {
		c.TracePath = *trace
	}
	if !filepath.IsAbs(c.TracePath) {
		c.TracePath = filepath.Join(root, c.TracePath)
	}
	c.ConfigDir = filepath.Join(root, c.ConfigDir)
	var err error
	if *speedup != 0 {
		c.Speedup = *speedup
	}
	if *fractions != "" {
		if c.Fractions, err = parseList(*fractions, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) }); err != nil {
			return fmt.Errorf("--fractions: %w", err)
		}
	}
	if *routers != "" || *restarts != "" {
		ks, rs := []int{1, 4}, []bool{false, true}
		if *routers != "" {
			if ks, err = parseList(*routers, strconv.Atoi); err != nil {
				return fmt.Errorf("--routers: %w", err)
			}
		}
		if *restarts != "" {
			if rs, err = parseList(*restarts, strconv.ParseBool); err != nil {
				return fmt.Errorf("--restarts: %w", err)
			}
		}
		c.Scenarios = sim.CrossScenarios(ks, rs)
	}
	if *strategies != "" {
		c.Strategies = strings.Split(*strategies, ",")
	}
	if *restartEvery != 0 {
		c.RestartEvery = *restartEvery
	}
	if *pods != 0 {
		c.Pods = *pods
	}
	if *cpuRatio >= 0 {
		c.CPURatio = *cpuRatio
	}
	if *maxRequests >= 0 {
		c.MaxRequests = *maxRequests
	}
	if *parallel != 0 {
		c.Parallel = *parallel
	}
	if *loadWindow >= 0 {
		c.LoadWindow = *loadWindow
	}
	if *loadSlack != 0 {
		c.LoadSlack = *loadSlack
	}
	if *seed != 0 {
		c.Seed = *seed
	}
	if *orders != 0 {
		c.Orders = *orders
	}
	if *jitter != 0 {
		c.Jitter = *jitter
	}
	if err := c.Validate(); err != nil {
		return err
	}
	c.Progress = stderr
	// GIE's plugins log through controller-runtime's logger; unset, it
	// complains once with a stack trace.
	crlog.SetLogger(logr.Discard())
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res, err := sim.Run(ctx, c)
	if err != nil {
		return err
	}
	rep := bench.Report{Title: "kvindex-sim", Figures: res.Figures()}
	if *report != "" {
		if err := os.MkdirAll(*report, 0o755); err != nil {
			return err
		}
		if err := res.WritePlot(filepath.Join(*report, "hit_rate.svg")); err != nil {
			return fmt.Errorf("writing the plot: %w", err)
		}
		f, err := os.Create(filepath.Join(*report, "report.md"))
		if err != nil {
			return err
		}
		if err := res.WriteMarkdown(f, "hit_rate.svg"); err != nil {
			_ = f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		rep.Notef("report: %s", filepath.Join(*report, "report.md"))
	}
	write := rep.WriteText
	if *output == "json" {
		write = rep.WriteJSON
	}
	if err := write(stdout); err != nil {
		return err
	}
	return validity(res, *allowInvalid)
}

// validity fails a run that is not valid, unless it is a quick run (a
// smoke run on a shared machine: its figures say valid or not, and that
// is all) or allowInvalid: such a run measured the machine falling
// behind, not the routers. The error names the first invalid runs.
func validity(res *sim.Result, allowInvalid bool) error {
	if res.Config.Quick || allowInvalid || res.Valid() {
		return nil
	}
	bad := res.Invalid()
	var b strings.Builder
	fmt.Fprintf(&b, "not valid: %d of %d runs fell behind their schedule (p99 lateness above %v%% of the trace span or effective speedup more than %v%% off %v); their figures measure the machine, not the routers", len(bad), len(res.Runs), 100*sim.MaxLateFraction, 100*sim.MaxSpeedupShortfall, res.Config.Speedup)
	for i, x := range bad {
		if i == 3 {
			fmt.Fprintf(&b, "; ...")
			break
		}
		fmt.Fprintf(&b, "; %s at fraction %v order %d: late p99 %v, speedup kept %.1f", x.Spec.Strategy, x.Spec.Fraction, x.Spec.Order, x.LateP99().Round(time.Millisecond), x.EffectiveSpeedup())
	}
	return errors.New(b.String())
}

func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, p := range strings.Split(s, ",") {
		v, err := parse(strings.TrimSpace(p))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// findRepo walks up from the working directory to the directory holding
// the default trace.
func findRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, sim.DefaultConfig().TracePath)); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the kvindex repository (no testdata/mooncake above the working directory): give --repo")
		}
		dir = parent
	}
}
