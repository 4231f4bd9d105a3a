// Command kvindex-bench measures kvindex against the performance goals of
// docs/DESIGN.md: its subcommands (fleet, ingest, lookup, coldstart) run
// the pipeline in this process and print each figure next to a reference
// measured in the same run (BENCHMARKS.md). It is a command of its own so
// that the simulator and the benchmark instruments stay out of the
// product binary, cmd/kvindex; `kvindex-bench --help` lists the
// subcommands and their flags.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvindex/kvindex/bench"
	"github.com/kvindex/kvindex/bench/benchcmd"
)

func main() {
	if code, ok := bench.EtcdNodeMain(); ok {
		os.Exit(code) // an etcd child of a run with --etcd-cpus
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := benchcmd.NewCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvindex-bench:", err)
		os.Exit(1)
	}
}
