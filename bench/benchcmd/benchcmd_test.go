package benchcmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.LeakOptions()...)
}

// figureLine is the shape every -o json line must have.
type figureLine struct {
	Figure    *string           `json:"figure"`
	Value     *float64          `json:"value"`
	Unit      *string           `json:"unit"`
	Reference *float64          `json:"reference"`
	Ratio     *float64          `json:"ratio"`
	Goal      *float64          `json:"goal"`
	Met       *bool             `json:"met"`
	Labels    map[string]string `json:"labels"`
}

// TestQuickSmoke runs every subcommand's --quick variant with -o json, in
// process, and checks that each prints figures of the documented shape
// with positive values. It checks that the commands run and print a
// result, not a speed. Under the race detector the four runs take minutes
// on 2 cores, so there it is skipped and .ci/run runs it without -race.
func TestQuickSmoke(t *testing.T) {
	if raceEnabled {
		t.Skip("too slow under -race; .ci/run runs it without -race")
	}
	if testing.Short() {
		t.Skip("runs the whole pipeline four times (about 15 s)")
	}
	// The figures each subcommand must print, at least once.
	want := map[string][]string{
		"fleet": {"fleet_events_per_second", "fleet_block_ops_per_second", "fleet_freshness_p50", "fleet_freshness_p99", "fleet_freshness_max",
			"fleet_freshness_ack_p99", "fleet_freshness_ingester_p99", "fleet_freshness_replica_p99", "fleet_raw_ceiling_block_ops_per_second",
			"fleet_ceiling_vs_v1_raw", "etcd_ops_per_block_op", "etcd_db_bytes_per_block_op_vs_v1", "etcd_db_bytes_per_block_op_raw_vs_v1", "watch_bytes_per_block_op"},
		"ingest": {"ingest_block_ops_per_second", "ingest_steady_block_ops_per_second", "raw_etcd_block_ops_per_second", "raw_etcd_vs_v1_raw_block_ops_per_second"},
		"lookup": {"lookup_ns_per_hash", "index_bytes_per_entry", "grpc_lookup_p50", "grpc_lookup_p99", "grpc_lookup_throughput"},
		"coldstart": {"coldstart_ready_seconds", "coldstart_ready_vs_v1_list_seconds", "coldstart_v1_list_seconds", "coldstart_get_seconds_vs_v1",
			"coldstart_get_bytes_vs_v1", "coldstart_heap_bytes_per_entry"},
	}
	// The figures the goals ask `fleet -o json` for, each with a goal (and
	// so a met), and the labels it names.
	withGoal := map[string][]string{
		"fleet_freshness_p99":              {"fsync", "rate"},
		"fleet_ceiling_vs_v1_raw":          nil,
		"etcd_ops_per_block_op":            nil,
		"etcd_db_bytes_per_block_op_vs_v1": nil,
	}
	for _, sub := range []string{"fleet", "ingest", "lookup", "coldstart"} {
		t.Run(sub, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(2*time.Minute))
			defer cancel()
			began := time.Now()
			out, err := runErr(ctx, sub, "--quick", "-o", "json")
			if err != nil {
				t.Fatalf("bench %s: %v", sub, err)
			}
			t.Logf("%s --quick took %s", sub, time.Since(began).Round(time.Millisecond))
			var names []string
			sc := bufio.NewScanner(bytes.NewReader(out))
			for sc.Scan() {
				var f figureLine
				dec := json.NewDecoder(strings.NewReader(sc.Text()))
				if err := dec.Decode(&f); err != nil {
					t.Fatalf("line %q: %v", sc.Text(), err)
				}
				if f.Figure == nil || f.Value == nil || f.Unit == nil || *f.Unit == "" {
					t.Fatalf("line %q lacks figure, value or unit", sc.Text())
				}
				if !(*f.Value > 0) {
					t.Errorf("figure %s: value %v, want positive", *f.Figure, *f.Value)
				}
				if (f.Reference == nil) != (f.Ratio == nil) {
					t.Errorf("figure %s: reference %v but ratio %v", *f.Figure, f.Reference, f.Ratio)
				}
				if f.Ratio != nil && *f.Ratio != *f.Value / *f.Reference {
					t.Errorf("figure %s: ratio %v, want value/reference %v", *f.Figure, *f.Ratio, *f.Value / *f.Reference)
				}
				if (f.Goal == nil) && f.Met != nil {
					t.Errorf("figure %s: met %v without a goal", *f.Figure, *f.Met)
				}
				if !bytes.Contains(sc.Bytes(), []byte(`"met":`)) || !bytes.Contains(sc.Bytes(), []byte(`"goal":`)) {
					t.Errorf("line %q: goal and met must be present (null when there is no goal)", sc.Text())
				}
				// The write-path figures say how etcd and the ingesters
				// ran: by default as production runs them.
				if sub == "fleet" || sub == "ingest" {
					size := strconv.Itoa(ingester.DefaultChunkSize)
					openAt := strconv.Itoa(ingester.DefaultChunkOpenAt(ingester.DefaultChunkSize, ingester.DefaultWindowLinger))
					linger := ingester.DefaultWindowLinger.String()
					if f.Labels["fsync"] != "on" || f.Labels["hash_mode"] != "token" || f.Labels["chunk_size"] != size || f.Labels["chunk_open_at"] != openAt || f.Labels["window_linger"] != linger {
						t.Errorf("figure %s: labels %v, want fsync on, hash_mode token, chunk_size %s, chunk_open_at %s and window_linger %s (the ingester's defaults)", *f.Figure, f.Labels, size, openAt, linger)
					}
				}
				if labels, ok := withGoal[*f.Figure]; ok && sub == "fleet" {
					if f.Goal == nil || f.Met == nil {
						t.Errorf("figure %s: goal %v, met %v; want both", *f.Figure, f.Goal, f.Met)
					}
					for _, l := range labels {
						if f.Labels[l] == "" {
							t.Errorf("figure %s: no label %s in %v", *f.Figure, l, f.Labels)
						}
					}
				}
				names = append(names, *f.Figure)
			}
			for _, n := range want[sub] {
				if !slices.Contains(names, n) {
					t.Errorf("no figure %s in %v", n, names)
				}
			}
		})
	}
}

// runErr executes `kvindex-bench args...` in process and returns its
// stdout, or its error with its stderr.
func runErr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := NewCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(ctx); err != nil {
		return nil, fmt.Errorf("%w\nstderr: %s", err, errOut.String())
	}
	return out.Bytes(), nil
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{name: "bad_output", args: []string{"ingest", "-o", "yaml"}},
		{name: "bad_entries", args: []string{"lookup", "--entries", "1M,zero"}},
		{name: "negative_entries", args: []string{"lookup", "--entries", "-5"}},
		{name: "two_coldstart_sizes", args: []string{"coldstart", "--entries", "1M,2M"}},
		{name: "coldstart_hash_mode", args: []string{"coldstart", "--hash-mode", "tokens"}},
		{name: "duration_without_rate", args: []string{"fleet", "--duration", "10s"}},
		{name: "zero_chunk_size", args: []string{"fleet", "--chunk-size", "0"}},
		{name: "chunk_size_past_the_value_limit", args: []string{"ingest", "--chunk-size", "100000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := NewCommand()
			cmd.SetOut(&bytes.Buffer{})
			cmd.SetErr(&bytes.Buffer{})
			cmd.SetArgs(tc.args)
			if err := cmd.ExecuteContext(context.Background()); !errors.Is(err, errUsage) {
				t.Fatalf("error %v, want a usage error", err)
			}
		})
	}
}

func TestParseCounts(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []int
	}{
		{name: "plain", in: "1000", want: []int{1000}},
		{name: "suffixes", in: "1M,5M,200k", want: []int{1_000_000, 5_000_000, 200_000}},
		{name: "spaces", in: " 2k , 3 ", want: []int{2000, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCounts(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := gocmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
}
