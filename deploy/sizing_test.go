package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	"etcd_heap_factor",
	"etcd_baseline_bytes",
	"etcd_quota_headroom",
	"etcd_quota_max_bytes",
	"etcd_volume_quota_factor",
	"etcd_volume_extra_bytes",
	"etcd_list_keys_per_second",
	"cold_start_factor",
	"compaction_list_multiple",
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

// etcdHistory is the number of revisions auto-compaction keeps: block-ops
// per second times the retention.
func (s sizing) etcdHistory(opsPerSecond float64, retention time.Duration) float64 {
	return opsPerSecond * retention.Seconds()
}

// etcdDB is the database size for entries live keys plus history
// revisions.
func (s sizing) etcdDB(entries, history float64) float64 {
	return (entries + history) * (s["key_bytes"] + s["etcd_bytes_per_revision"])
}

func (s sizing) etcdQuotaMin(entries, history float64) float64 {
	return s["etcd_quota_headroom"] * s.etcdDB(entries, history)
}

func (s sizing) etcdMemory(entries, history float64) float64 {
	return s["etcd_heap_factor"]*(entries+history)*(s["etcd_index_bytes_per_key"]+s["key_bytes"]) + s["etcd_baseline_bytes"]
}

func (s sizing) etcdVolume(quota float64) float64 {
	return s["etcd_volume_quota_factor"]*quota + s["etcd_volume_extra_bytes"]
}

// retentionMin is compaction_list_multiple x the time an indexd takes to
// list entries keys, at the cold-start goal's pace.
func (s sizing) retentionMin(entries float64) time.Duration {
	secs := s["compaction_list_multiple"] * s["cold_start_factor"] * entries / s["etcd_list_keys_per_second"]
	return time.Duration(secs * float64(time.Second))
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
					t.Errorf("%s: quota-backend-bytes %.0f is under %.0f = etcd_quota_headroom x (%.0f entries + %.0f history revisions) x (key_bytes + etcd_bytes_per_revision)",
						w, quota, min, e, history)
				}
				if quota > s["etcd_quota_max_bytes"] {
					t.Errorf("%s: quota-backend-bytes %.0f is over etcd_quota_max_bytes %.0f; shard by model instead (DESIGN, \"Scaling out\")", w, quota, s["etcd_quota_max_bytes"])
				}
				checkMemory(t, w, c, s.etcdMemory(e, history),
					fmt.Sprintf("etcd_heap_factor x (%.0f entries + %.0f history) x (etcd_index_bytes_per_key + key_bytes) + etcd_baseline_bytes", e, history))
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
		"etcd_heap_factor": 2, "etcd_baseline_bytes": 500, "etcd_quota_headroom": 2,
		"etcd_volume_quota_factor": 2, "etcd_volume_extra_bytes": 7,
		"etcd_list_keys_per_second": 1000, "cold_start_factor": 1.25, "compaction_list_multiple": 10,
	}
	h := s.etcdHistory(10, time.Minute) // 600 revisions
	cases := []struct {
		name      string
		got, want float64
	}{
		{name: "history", got: h, want: 600},
		{name: "etcd_db", got: s.etcdDB(400, h), want: 1000 * 180},
		{name: "etcd_quota_min", got: s.etcdQuotaMin(400, h), want: 2 * 1000 * 180},
		{name: "etcd_memory", got: s.etcdMemory(400, h), want: 2*1000*220 + 500},
		{name: "etcd_volume", got: s.etcdVolume(100), want: 207},
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
