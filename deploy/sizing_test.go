package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// The sizing inputs a workload was sized for, as annotations on it.
const (
	annotEntries = "sizing.kvindex.io/entries"
	annotOps     = "sizing.kvindex.io/block-ops-per-second"
)

// sizingFigures are the rows of README.md's sizing table the formulas use.
// The table is the one place the numbers live: update it when
// BENCHMARKS.md measures them, and this test says which manifests no
// longer fit.
var sizingFigures = []string{
	"indexd_bytes_per_entry",
	"indexd_relist_factor",
	"indexd_baseline_bytes",
	"etcd_index_bytes_per_key",
	"etcd_bytes_per_revision",
	"key_bytes",
	"chunk_entries",
	"chunk_entry_bytes",
	"etcd_revisions_per_block_op",
	"etcd_heap_factor",
	"etcd_baseline_bytes",
	"etcd_quota_headroom",
	"etcd_quota_max_bytes",
	"etcd_volume_quota_factor",
	"etcd_volume_extra_bytes",
	"etcd_list_keys_per_second",
	"cold_start_factor",
	"compaction_list_multiple",
	"indexd_ready_seconds_1m",
	"indexd_ready_seconds_5m",
}

// readSizingTable parses the rows "| `name` | value | ..." of README.md's
// section "## Sizing".
func readSizingTable(path string) (map[string]float64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	figures := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	inSizing := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "## ") {
			inSizing = line == "## Sizing"
		}
		if !inSizing || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		v, err := strconv.ParseFloat(strings.ReplaceAll(strings.TrimSpace(cells[2]), ",", ""), 64)
		if err != nil {
			return nil, fmt.Errorf("sizing figure %s: value %q: %w", name, cells[2], err)
		}
		if _, dup := figures[name]; dup {
			return nil, fmt.Errorf("sizing figure %s appears twice", name)
		}
		figures[name] = v
	}
	return figures, sc.Err()
}

// sizing holds the figures and computes the formulas of README.md,
// "Sizing". Every result is in bytes or seconds.
type sizing map[string]float64

// etcdHistory is the most revisions periodic auto-compaction keeps: etcd
// 3.7 compacts every min(retention, 1 h) to the revision from retention
// ago (server/etcdserver/api/v3compactor/periodic.go), so just before a
// compaction the history spans retention + min(retention, 1 h) of
// block-ops, each making etcd_revisions_per_block_op chunk revisions.
func (s sizing) etcdHistory(opsPerSecond float64, retention time.Duration) float64 {
	return opsPerSecond * s["etcd_revisions_per_block_op"] * (retention + min(retention, time.Hour)).Seconds()
}

// chunkKeys is the number of live chunk keys that hold entries.
func (s sizing) chunkKeys(entries float64) float64 { return entries / s["chunk_entries"] }

// revisionBytes is what one chunk revision costs the database: its key,
// its value (the width byte and chunk_entries entries) and bbolt's own.
func (s sizing) revisionBytes() float64 {
	return s["key_bytes"] + 1 + s["chunk_entries"]*s["chunk_entry_bytes"] + s["etcd_bytes_per_revision"]
}

// etcdDB is the database size for entries live (block, endpoint, tier)
// entries, in chunks, plus history revisions.
func (s sizing) etcdDB(entries, history float64) float64 {
	return (s.chunkKeys(entries) + history) * s.revisionBytes()
}

func (s sizing) etcdQuotaMin(entries, history float64) float64 {
	return s["etcd_quota_headroom"] * s.etcdDB(entries, history)
}

func (s sizing) etcdMemory(entries, history float64) float64 {
	return s["etcd_heap_factor"]*(s.chunkKeys(entries)+history)*(s["etcd_index_bytes_per_key"]+s["key_bytes"]) + s["etcd_baseline_bytes"]
}

func (s sizing) etcdVolume(quota float64) float64 {
	return s["etcd_volume_quota_factor"]*quota + s["etcd_volume_extra_bytes"]
}

// listBound is the bound on the time an indexd takes to list entries
// keys: the measured unpaged Get pace times the cold-start goal.
func (s sizing) listBound(entries float64) time.Duration {
	secs := s["cold_start_factor"] * entries / s["etcd_list_keys_per_second"]
	return time.Duration(secs * float64(time.Second))
}

// retentionMin is compaction_list_multiple x listBound: the shortest
// auto-compaction retention, and the shortest startup window of indexd.
func (s sizing) retentionMin(entries float64) time.Duration {
	return time.Duration(s["compaction_list_multiple"] * float64(s.listBound(entries)))
}

func (s sizing) indexdMemory(entries float64) float64 {
	return s["indexd_relist_factor"]*entries*s["indexd_bytes_per_entry"] + s["indexd_baseline_bytes"]
}

func TestSizing(t *testing.T) {
	bs := okBuilds(t)
	figs, err := readSizingTable(filepath.Join(deployRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range sizingFigures {
		if v, ok := figs[name]; !ok || v <= 0 {
			t.Fatalf("README.md's sizing table has no positive figure %s", name)
		}
	}
	s := sizing(figs)
	// The bound must hold where it was measured.
	for _, m := range []struct {
		entries float64
		figure  string
	}{{1e6, "indexd_ready_seconds_1m"}, {5e6, "indexd_ready_seconds_5m"}} {
		if bound, measured := s.listBound(m.entries), time.Duration(s[m.figure]*float64(time.Second)); bound < measured {
			t.Errorf("the list-time bound for %.0f entries, %v = cold_start_factor x entries / etcd_list_keys_per_second, is under the measured %v (%s)",
				m.entries, bound, measured, m.figure)
		}
	}
	var checked int
	for _, b := range bs {
		etcds, indexds := byComponent(b, "etcd"), byComponent(b, "indexd")
		if len(etcds) == 0 && len(indexds) == 0 {
			continue
		}
		checked++
		t.Run(b.Dir, func(t *testing.T) {
			var entries float64
			for _, w := range indexds {
				entries = annotation(t, w, annotEntries)
				c := containerNamed(w, "indexd")
				if c == nil {
					t.Fatalf("%s: no container indexd", w)
				}
				checkMemory(t, w, c, s.indexdMemory(entries),
					fmt.Sprintf("indexd_relist_factor x %.0f entries x indexd_bytes_per_entry + indexd_baseline_bytes", entries))
				// A first list slower than the startup window restarts the
				// replica, which starts the list over.
				if pr := c.StartupProbe; pr == nil {
					t.Errorf("%s: no startup probe; the first list of %.0f entries may take up to %v", w, entries, s.listBound(entries))
				} else if window, min := time.Duration(pr.PeriodSeconds*pr.FailureThreshold)*time.Second, s.retentionMin(entries); window < min {
					t.Errorf("%s: startup probe window %v (periodSeconds x failureThreshold) is under %v = compaction_list_multiple x the list-time bound for %.0f entries",
						w, window, min, entries)
				}
			}
			for _, w := range etcds {
				e := annotation(t, w, annotEntries)
				if len(indexds) > 0 && e != entries {
					t.Errorf("%s is sized for %.0f entries but indexd for %.0f; every indexd holds every entry in etcd", w, e, entries)
				}
				ops := annotation(t, w, annotOps)
				members, c := etcdMembers(t, b, w)
				if len(members) == 0 {
					return
				}
				cfg := members[0].Cfg
				retention, err := time.ParseDuration(cfg.AutoCompactionRetention)
				if err != nil {
					t.Fatalf("%s: auto-compaction retention %q is not a duration", w, cfg.AutoCompactionRetention)
				}
				if min := s.retentionMin(e); retention < min {
					t.Errorf("%s: auto-compaction retention %v is under %v = compaction_list_multiple x cold_start_factor x %.0f entries / etcd_list_keys_per_second; a re-list could be compacted away under it",
						w, retention, min.Round(time.Second), e)
				}
				history := s.etcdHistory(ops, retention)
				quota := float64(cfg.QuotaBackendBytes)
				if min := s.etcdQuotaMin(e, history); quota < min {
					t.Errorf("%s: quota-backend-bytes %.0f is under %.0f = etcd_quota_headroom x (%.0f entries / chunk_entries + %.0f history revisions) x (key_bytes + 1 + chunk_entries x chunk_entry_bytes + etcd_bytes_per_revision)",
						w, quota, min, e, history)
				}
				if quota > s["etcd_quota_max_bytes"] {
					t.Errorf("%s: quota-backend-bytes %.0f is over etcd_quota_max_bytes %.0f; shard by model instead (DESIGN, \"Scaling out\")", w, quota, s["etcd_quota_max_bytes"])
				}
				checkMemory(t, w, c, s.etcdMemory(e, history),
					fmt.Sprintf("etcd_heap_factor x (%.0f entries / chunk_entries + %.0f history) x (etcd_index_bytes_per_key + key_bytes) + etcd_baseline_bytes", e, history))
				var volume float64
				for _, pvc := range w.STS.Spec.VolumeClaimTemplates {
					if q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
						volume = float64(q.Value())
					}
				}
				if min := s.etcdVolume(quota); volume < min {
					t.Errorf("%s: volume %.0f bytes is under %.0f = etcd_volume_quota_factor x quota + etcd_volume_extra_bytes", w, volume, min)
				}
			}
		})
	}
	if checked == 0 {
		t.Fatal("no build has etcd or indexd to size")
	}
}

// checkMemory requires the container's memory limit and request to be at
// least need (request = limit: the sizing is what the process needs, not a
// burst).
func checkMemory(t *testing.T, w *workload, c *corev1.Container, need float64, formula string) {
	t.Helper()
	lim, req := c.Resources.Limits[corev1.ResourceMemory], c.Resources.Requests[corev1.ResourceMemory]
	if float64(lim.Value()) < need || float64(req.Value()) < need {
		t.Errorf("%s: memory request %s / limit %s is under %.0f MiB = %s",
			w, req.String(), lim.String(), math.Ceil(need/(1<<20)), formula)
	}
}

func annotation(t *testing.T, w *workload, key string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(w.Annotations[key], 64)
	if err != nil || v <= 0 {
		t.Fatalf("%s: annotation %s=%q must be the positive number it was sized for", w, key, w.Annotations[key])
	}
	return v
}

func containerNamed(w *workload, name string) *corev1.Container {
	for _, c := range w.Containers() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// TestSizingFormulas pins the formulas to hand-computed values, so a
// broken formula cannot pass every manifest.
func TestSizingFormulas(t *testing.T) {
	s := sizing{
		"indexd_bytes_per_entry": 48, "indexd_relist_factor": 2, "indexd_baseline_bytes": 1000,
		"etcd_index_bytes_per_key": 120, "etcd_bytes_per_revision": 80, "key_bytes": 100,
		"chunk_entries": 4, "chunk_entry_bytes": 16, "etcd_revisions_per_block_op": 0.5,
		"etcd_heap_factor": 2, "etcd_baseline_bytes": 500, "etcd_quota_headroom": 2,
		"etcd_volume_quota_factor": 2, "etcd_volume_extra_bytes": 7,
		"etcd_list_keys_per_second": 1000, "cold_start_factor": 1.25, "compaction_list_multiple": 10,
	}
	h := s.etcdHistory(10, time.Minute) // 10 x 0.5 x (60 + 60) = 600 revisions
	cases := []struct {
		name      string
		got, want float64
	}{
		{name: "history", got: h, want: 600},
		{name: "history_past_an_hour", got: s.etcdHistory(2, 3*time.Hour), want: 4 * 3600},
		{name: "chunk_keys", got: s.chunkKeys(1600), want: 400},
		{name: "revision_bytes", got: s.revisionBytes(), want: 100 + 1 + 4*16 + 80},
		{name: "etcd_db", got: s.etcdDB(1600, h), want: 1000 * 245},
		{name: "etcd_quota_min", got: s.etcdQuotaMin(1600, h), want: 2 * 1000 * 245},
		{name: "etcd_memory", got: s.etcdMemory(1600, h), want: 2*1000*220 + 500},
		{name: "etcd_volume", got: s.etcdVolume(100), want: 207},
		{name: "list_bound_seconds", got: s.listBound(2000).Seconds(), want: 1.25 * 2},
		{name: "retention_min_seconds", got: s.retentionMin(2000).Seconds(), want: 10 * 1.25 * 2},
		{name: "indexd_memory", got: s.indexdMemory(1000), want: 2*1000*48 + 1000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if math.Abs(tc.got-tc.want) > 1e-9 {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
}

// TestSizingCitations: every BENCHMARKS.md section README.md cites exists,
// so a measured figure names where it was measured.
func TestSizingCitations(t *testing.T) {
	builds(t) // sets deployRoot
	readme, err := os.ReadFile(filepath.Join(deployRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	bench, err := os.ReadFile(filepath.Join(filepath.Dir(deployRoot), "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, line := range strings.Split(string(bench), "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			headings[strings.TrimSpace(strings.TrimLeft(h, "#"))] = true
		}
	}
	cites := regexp.MustCompile(`BENCHMARKS\.md,\s+"([^"]+)"`).FindAllStringSubmatch(string(readme), -1)
	if len(cites) == 0 {
		t.Fatal("README.md cites no BENCHMARKS.md section; its measured figures must say where they come from")
	}
	for _, c := range cites {
		if !headings[c[1]] {
			t.Errorf("README.md cites BENCHMARKS.md, %q, which has no such section", c[1])
		}
	}
}

// TestKeyBytes pins what the sizing table says of key_bytes and of the
// chunk values to the key schema: a chunk key is 42 bytes plus the model,
// the pod and the rank's digits; the example is 64 bytes; key_bytes
// allows 57 bytes of model and pod names; and a chunk revision's value is
// 1 + chunk_entries x chunk_entry_bytes, at token mode's entry width (the
// larger).
func TestKeyBytes(t *testing.T) {
	builds(t)
	figs, err := readSizingTable(filepath.Join(deployRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	ks := keyspace.Default()
	key := func(model, pod string, rank uint32) int {
		return len(ks.ChunkKey(keyspace.Endpoint{Model: model, Pod: pod, Rank: rank}, tier.Disk, 0x0123456789abcdef))
	}
	if got := key("qwen3-8b", "10.0.0.5:8000", 0); got != 65 {
		t.Errorf("the example chunk key is %d bytes, README.md says 65", got)
	}
	for _, ep := range []struct {
		model, pod string
		rank       uint32
	}{{"m", "p", 0}, {"qwen3-8b", "10.0.0.5:8000", 7}, {"model", "pod", 12}} {
		if overhead := key(ep.model, ep.pod, ep.rank) - len(ep.model) - len(ep.pod) - len(strconv.Itoa(int(ep.rank))); overhead != 43 {
			t.Errorf("%+v: a chunk key in the disk tier is 43 bytes plus the names and rank, README.md says; it is %d", ep, overhead)
		}
	}
	if allowed := figs["key_bytes"] - 43 - 1; allowed != 56 {
		t.Errorf("key_bytes %v allows %v bytes of model and pod names with a one-digit rank; README.md says 56", figs["key_bytes"], allowed)
	}
	if figs["chunk_entry_bytes"] != keyspace.ChunkWidthKeyEngine {
		t.Errorf("chunk_entry_bytes %v is not token mode's entry width %d", figs["chunk_entry_bytes"], keyspace.ChunkWidthKeyEngine)
	}
	n := figs["chunk_entries"]
	if n != math.Trunc(n) || n < 1 || n > keyspace.DefaultChunkSize {
		t.Fatalf("chunk_entries %v is not a whole number of entries from 1 to the chunk size %d", n, keyspace.DefaultChunkSize)
	}
	if got, want := 1+n*figs["chunk_entry_bytes"], float64(keyspace.ChunkValueLen(int(n), true)); got != want {
		t.Errorf("a chunk value of chunk_entries entries is %v bytes by the table, %v by keyspace", got, want)
	}
}
