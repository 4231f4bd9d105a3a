// Package migratecmd wires `kvindex migrate`: flags to migrate.Config, the
// etcd client, and the report on stdout (text or -o json).
package migratecmd

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/migrate"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

// usagef is common.Usagef: bad command-line input, exit status 2.
var usagef = common.Usagef

// NewCommand returns `kvindex migrate`.
func NewCommand() *cobra.Command {
	var (
		logFlags  common.Logging
		etcdFlags common.Etcd
		from, to  string
		output    string
		cfg       = migrate.DefaultConfig()
	)
	cmd := &cobra.Command{
		Use:   "migrate [--dry-run]",
		Short: "Convert a v1 etcd keyspace (a key per block) to v2 (chunks), with the ingesters stopped",
		Long: `migrate converts the v1 keyspace under --from-prefix (one key per block,
endpoint and tier) into the v2 keyspace under --to-prefix (chunks of up to
--chunk-size blocks per endpoint and tier, DESIGN "etcd keyspace (v2)"):
the same endpoints and blocks, on the same lease IDs (so every TTL is kept
exactly), the endpoint records with chunk_next and their lease key counts
in chunks, and the members, owners and offsets as they were. It leaves the
v1 keys alone: delete them with etcdctl once the v2 roles run
(deploy/README.md, "Upgrades").

Run it with every ingester stopped, v1 and v2: it refuses while an
ingesters/ key exists under either prefix, and every transaction it sends
carries that check. It is idempotent: a second run writes nothing, and a
run that stopped part way is finished by the next. It refuses a v2
keyspace that a v2 ingester has already written to (a v2 offset past
v1's). Start the v2 ingesters before the shortest lease TTL it reports
runs out, as after any ingester restart.

--dry-run reads everything and reports what it would write, writing
nothing. With -o json the report is one object (migrate.Report).`,
		Example: `  kvindex migrate --etcd-endpoints http://etcd:2379 --dry-run
  kvindex migrate --etcd-endpoints http://etcd:2379 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("etcd-prefix") {
				return usagef("--etcd-prefix: migrate reads --from-prefix and writes --to-prefix")
			}
			if output != "text" && output != "json" {
				return usagef("-o %q: want text or json", output)
			}
			if err := common.CheckPositive(cmd.Flags(), "chunk-size", "max-txn-ops", "max-txn-bytes", "page-size", "etcd-dial-timeout"); err != nil {
				return usagef("%v", err)
			}
			var err error
			if cfg.From, err = keyspace.New(from); err != nil {
				return usagef("--from-prefix: %v", err)
			}
			if cfg.To, err = keyspace.New(to); err != nil {
				return usagef("--to-prefix: %v", err)
			}
			if strings.HasPrefix(from, to) || strings.HasPrefix(to, from) {
				return usagef("--from-prefix %q and --to-prefix %q overlap: want two separate keyspaces", from, to)
			}
			cfg.CallTimeout = etcdFlags.DialTimeout
			log, err := logFlags.Logger()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			cli, err := etcdFlags.Client(ctx, log)
			if err != nil {
				return err
			}
			defer cli.Close()
			cfg.Etcd, cfg.Logger = cli, log.With("component", "migrate")
			if err := cfg.Validate(); err != nil {
				return usagef("%v", common.FlagNames(err, cmd.Flags(), &cfg))
			}
			if err := etcdFlags.Reach(ctx, cli, cfg.To.Prefix()); err != nil {
				return err
			}
			// Validate passed above, so Run's errors are not the config's.
			rep, err := migrate.Run(ctx, cfg)
			if rep != nil && (err == nil || rep.Committed > 0) {
				if werr := write(cmd, output, rep); werr != nil && err == nil {
					err = werr
				}
			}
			return err
		},
	}
	fs := cmd.Flags()
	logFlags.Register(fs)
	etcdFlags.Register(fs)
	_ = fs.MarkHidden("etcd-prefix")
	fs.StringVar(&from, "from-prefix", migrate.V1Prefix, "prefix of the v1 keyspace to read (must end in '/')")
	fs.StringVar(&to, "to-prefix", keyspace.DefaultPrefix, "prefix of the v2 keyspace to write (must end in '/'; the roles' --etcd-prefix)")
	fs.IntVar(&cfg.ChunkSize, "chunk-size", cfg.ChunkSize, fmt.Sprintf("most blocks per chunk, at most %d (the ingester's --chunk-size)", keyspace.MaxChunkEntries))
	fs.IntVar(&cfg.MaxTxnOps, "max-txn-ops", cfg.MaxTxnOps, "most operations per transaction, its 2 guards included (at most etcd's --max-txn-ops)")
	fs.IntVar(&cfg.MaxTxnBytes, "max-txn-bytes", cfg.MaxTxnBytes, "most bytes of keys and values per transaction (under etcd's --max-request-bytes)")
	fs.IntVar(&cfg.PageSize, "page-size", cfg.PageSize, "most keys per range read (ranges are read per endpoint)")
	fs.BoolVar(&cfg.DryRun, "dry-run", false, "read and report what would be written, writing nothing")
	fs.StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

func write(cmd *cobra.Command, output string, rep *migrate.Report) error {
	if output == "json" {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.WriteText(cmd.OutOrStdout())
}
