// Command kvindex is the single binary of kvindex: a live KV-cache block
// index for LLM routers. Its subcommands run the roles (ingester, indexd,
// bridge, standalone) and the operator tools (lookup, endpoints, inspect,
// migrate, replay); `kvindex --help` lists them. The benchmarks are a
// command of their own, cmd/kvindex-bench.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvindex/kvindex/wiring/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.NewRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvindex:", err)
		os.Exit(cli.ExitCode(err))
	}
}
