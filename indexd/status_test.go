package indexd

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// getStatus renders the status page for query and returns its body.
func getStatus(t *testing.T, srv *Server, method, query string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.StatusHandler().ServeHTTP(rec, httptest.NewRequest(method, "/status?"+query, nil))
	body, _ := io.ReadAll(rec.Body)
	return rec.Code, string(body)
}

var podCell = regexp.MustCompile(`<td class="m pod">([^<]*)</td>`)

// TestStatusPage checks the page against the index it renders: hostile
// names come out escaped, the endpoint list pages through every endpoint
// exactly once, and the lookup form answers what Lookup answers.
func TestStatusPage(t *testing.T) {
	e := testutil.StartEtcd(t)
	w := newWriter(t, e.Client)
	hostile := keyspace.Endpoint{Model: `m<script>alert(1)</script>`, Pod: `"><img src=x onerror=alert(1)>`, Rank: 0}
	plain := keyspace.Endpoint{Model: "m2", Pod: "vllm-0", Rank: 1}
	var ops []any
	ops = append(ops, w.record(hostile, keyspace.EndpointRecord{BlockSize: 16}), w.record(plain, keyspace.EndpointRecord{BlockSize: 16}))
	for i := range 5 {
		ops = append(ops, w.put(keyspace.Block{Endpoint: plain, Tier: tier.GPU, Hash: uint64(100 + i)}))
	}
	ops = append(ops, w.put(keyspace.Block{Endpoint: plain, Tier: tier.CPU, Hash: 105}))
	ops = append(ops, w.put(keyspace.Block{Endpoint: hostile, Tier: tier.GPU, Hash: 100}))
	w.commit(ops...)
	var many []keyspace.Endpoint
	for i := range 25 {
		many = append(many, keyspace.Endpoint{Model: "m3", Pod: fmt.Sprintf("pod-%02d", i)})
	}
	putEndpoints(t, e.Client, many)

	r := startReplica(t, e.Client)
	r.waitServing(t)
	eventually(t, "every endpoint to be indexed", func() bool {
		infos, _ := r.srv.refl.current().ListEndpoints("")
		return len(infos) == 27
	})

	code, body := getStatus(t, r.srv, http.MethodGet, "")
	if code != http.StatusOK {
		t.Fatalf("GET /status: %d %s", code, body)
	}
	for _, raw := range []string{"<script>alert", "<img src=x"} {
		if strings.Contains(body, raw) {
			t.Errorf("the page carries %q unescaped", raw)
		}
	}
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") || !strings.Contains(body, "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;") {
		t.Errorf("the hostile names are not shown escaped:\n%s", body)
	}
	if !strings.Contains(body, `<span class="ok">ready</span>`) {
		t.Errorf("the page does not say ready")
	}
	// The partition the writer advanced, with its stored and applied
	// offsets equal (the replica applied every commit).
	if !strings.Contains(body, `<td class="n stored">1</td><td class="n applied">1</td><td class="n lag">0</td>`) {
		t.Errorf("partition row with stored 1, applied 1, lag 0 missing:\n%s", body)
	}

	// Paging: every endpoint once, in ListEndpoints order, 10 per page.
	var pods []string
	query := "page_size=10"
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("more pages than endpoints allow")
		}
		_, body := getStatus(t, r.srv, http.MethodGet, query)
		if n := len(podCell.FindAllString(body, -1)); n > 10 {
			t.Fatalf("page of %d rows, page_size 10", n)
		}
		for _, m := range podCell.FindAllStringSubmatch(body, -1) {
			pods = append(pods, m[1])
		}
		next := regexp.MustCompile(`<a id="next" href="\?([^"]*)"`).FindStringSubmatch(body)
		if next == nil {
			break
		}
		query = strings.ReplaceAll(next[1], "&amp;", "&")
	}
	// Models sort "m2" < "m3" < "m<script>...".
	want := []string{"vllm-0"}
	for _, ep := range many {
		want = append(want, ep.Pod)
	}
	want = append(want, "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;")
	if diff := cmp.Diff(want, pods); diff != "" {
		t.Errorf("pods over every page (-want +got):\n%s", diff)
	}

	// The lookup form, in engine hashes: vllm-0 holds 100..104 on GPU and
	// 105 on CPU.
	q := url.Values{"lookup_model": {"m2"}, "kind": {"hashes"}, "q": {"0000000000000064 65,66 67 68 69 6a"}}
	_, body = getStatus(t, r.srv, http.MethodGet, q.Encode())
	if !strings.Contains(body, `<td class="m pod">vllm-0</td><td class="n rank">1</td><td class="n blocks">6</td>`) {
		t.Errorf("lookup answer without vllm-0 rank 1 matching 6 blocks:\n%s", body)
	}
	if !strings.Contains(body, `<td class="tiers">gpu×5 cpu×1</td>`) {
		t.Errorf("lookup answer without its tier runs")
	}
	// Bad input is an error on the page, not a crash.
	q.Set("q", "zz")
	if _, body = getStatus(t, r.srv, http.MethodGet, q.Encode()); !strings.Contains(body, `&#34;zz&#34; is not a hex block hash`) {
		t.Errorf("bad hash not reported")
	}
	q = url.Values{"lookup_model": {"m2"}, "q": {"1,2,x"}}
	if _, body = getStatus(t, r.srv, http.MethodGet, q.Encode()); !strings.Contains(body, `&#34;x&#34; is not a token id`) {
		t.Errorf("bad token id not reported")
	}

	for _, tc := range []struct {
		method, query string
		want          int
	}{
		{http.MethodPost, "", http.StatusMethodNotAllowed},
		{http.MethodGet, "page_size=0", http.StatusBadRequest},
		{http.MethodGet, "after=bogus", http.StatusBadRequest},
		// A token of another model's list, as ListEndpoints refuses it
		// (it answered 200 with an empty page).
		{http.MethodGet, "model=a&after=" + url.QueryEscape(encodePageToken(keyspace.Endpoint{Model: "z", Pod: "p"})), http.StatusBadRequest},
		{http.MethodGet, "q=" + strings.Repeat("1,", StatusMaxQueryBytes), http.StatusRequestURITooLong},
	} {
		if code, _ := getStatus(t, r.srv, tc.method, tc.query); code != tc.want {
			t.Errorf("%s %.40s: %d, want %d", tc.method, tc.query, code, tc.want)
		}
	}
}
