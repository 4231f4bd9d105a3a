package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kvindex/kvindex/internal/testutil"
)

// chromiumPath finds Debian's chromium. Without one the test skips with a
// message, except under CI (CI set), where it fails: .ci/run installs it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium on PATH under CI: .ci/run installs it (apt-get install -y chromium)")
	}
	t.Skip("no chromium on PATH: install Debian's chromium (apt-get install -y chromium) to run the status page test")
	return ""
}

// TestStatusPageInBrowser loads indexd's /status page of a live standalone
// stack fed by scenarios in headless Chromium, checks that the endpoints'
// blocks per tier it shows are what ListEndpoints (what `kvindex
// endpoints` prints) answers, submits the lookup form and checks its
// answer against Lookup (what `kvindex lookup` prints), and saves a
// screenshot (KVINDEX_STATUS_SCREENSHOT names the file; default: the
// test's temp dir).
func TestStatusPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a stack and a browser")
	}
	chrome := chromiumPath(t)
	s, idx := engineStack(t, "p05_tiers_and_offload.jsonl", "p06_data_parallel_ranks.jsonl", "p09_names_and_models.jsonl")

	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(2*time.Minute))
	defer cancel()
	list, err := idx.ListEndpoints(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Endpoints) == 0 {
		t.Fatal("the scenarios left no endpoint")
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.Flag("headless", true), chromedp.WindowSize(1280, 1400))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()

	// Every endpoint's row: model (of its table), pod, rank, gpu, cpu,
	// disk blocks, as the page shows them (its text, after escaping).
	url := "http://" + s.MetricsAddr() + "/status?page_size=500"
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible("#endpoints")); err != nil {
		t.Fatal(err)
	}
	rows, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("table.eps tr.ep")).map(r =>
			[r.closest("table").dataset.model, r.querySelector(".pod").textContent, r.querySelector(".rank").textContent,
			 r.querySelector(".gpu-blocks").textContent, r.querySelector(".cpu-blocks").textContent, r.querySelector(".disk-blocks").textContent].join("\t"))`))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range list.Endpoints {
		want = append(want, strings.Join([]string{e.Model, e.Endpoint.Pod, strconv.FormatUint(uint64(e.Endpoint.DPRank), 10),
			strconv.FormatUint(e.GPUBlocks, 10), strconv.FormatUint(e.CPUBlocks, 10), strconv.FormatUint(e.DiskBlocks, 10)}, "\t"))
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("the page's endpoints differ from ListEndpoints:\npage:\n%s\nListEndpoints:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}

	// The lookup form: the two hashes p06 leaves on vllm-0 rank 0.
	model := "meta-llama/Llama-3.1-8B-Instruct"
	hashes := []string{"2ce1b67b7a66ae10", "781eaa0ef9083c4d"}
	ready, err := chromedp.Run(bctx, chromedp.Text("#ready"))
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(bctx,
		chromedp.SetValue(`input[name="lookup_model"]`, model),
		chromedp.Click(`input[name="kind"][value="hashes"]`),
		chromedp.SetValue(`textarea[name="q"]`, strings.Join(hashes, " ")),
		chromedp.Submit(`#lookup-form`),
		chromedp.WaitVisible("#result"),
	); err != nil {
		t.Fatal(err)
	}
	matches, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#result tr.match")).map(r =>
			[r.querySelector(".pod").textContent, r.querySelector(".rank").textContent, r.querySelector(".blocks").textContent, r.querySelector(".tiers").textContent].join("\t"))`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ready, "ready") {
		t.Errorf("readiness on the page: %q", ready)
	}
	var hs []uint64
	for _, h := range hashes {
		v, _ := strconv.ParseUint(h, 16, 64)
		hs = append(hs, v)
	}
	res, err := idx.Lookup(ctx, model, hs)
	if err != nil {
		t.Fatal(err)
	}
	var wantM []string
	for _, m := range res.Matches {
		var runs []string
		for i := 0; i < len(m.Tiers); {
			j := i
			for j < len(m.Tiers) && m.Tiers[j] == m.Tiers[i] {
				j++
			}
			runs = append(runs, fmt.Sprintf("%s×%d", m.Tiers[i].String(), j-i))
			i = j
		}
		wantM = append(wantM, strings.Join([]string{m.Endpoint.Pod, strconv.FormatUint(uint64(m.Endpoint.DPRank), 10), strconv.Itoa(m.Blocks), strings.Join(runs, " ")}, "\t"))
	}
	if len(wantM) == 0 || strings.Join(matches, "\n") != strings.Join(wantM, "\n") {
		t.Errorf("the form's answer differs from Lookup (or is empty):\npage:\n%s\nLookup:\n%s", strings.Join(matches, "\n"), strings.Join(wantM, "\n"))
	}

	if err := chromedp.Do(bctx, chromedp.Navigate(url+"&lookup_model="+model+"&kind=hashes&q="+strings.Join(hashes, "+")),
		chromedp.WaitVisible("#result")); err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	out := os.Getenv("KVINDEX_STATUS_SCREENSHOT")
	if out == "" {
		out = filepath.Join(t.TempDir(), "status.png")
	} else if !filepath.IsAbs(out) {
		out = filepath.Join(testutil.RepoRoot(t), out)
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", out, len(png))
}
