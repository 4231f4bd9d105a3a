package indexd

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// Status page limits (docs/limits.md "Status page").
const (
	// DefaultStatusPageSize is how many endpoints one status page shows
	// when the request names no page_size; a request may ask for up to
	// Config.MaxListPageSize.
	DefaultStatusPageSize = 100
	// StatusMaxModels is how many models the status page's summary lists;
	// the rest are counted.
	StatusMaxModels = 100
	// StatusMaxPartitions is how many partitions the status page reads
	// from etcd and shows; the rest are counted.
	StatusMaxPartitions = 256
	// StatusMaxQueryBytes bounds the status page's query string (the
	// lookup form's ids or hashes); longer requests are refused with 414.
	StatusMaxQueryBytes = 256 << 10
	// statusEtcdTimeout bounds the page's reads of owners and stored
	// offsets from etcd.
	statusEtcdTimeout = 2 * time.Second
)

// StatusHandler returns the replica's read-only status page, meant for
// the ops HTTP server's /status (internal/opsserver): server-rendered
// HTML with no external assets, every name escaped by html/template.
//
// It shows the replica (revision, progress age, readiness); per model
// the endpoints of one page of ListEndpoints' order (page_size, default
// DefaultStatusPageSize, at most Config.MaxListPageSize; the page token
// of ListEndpoints in "after") with their blocks per tier as bars, last
// heard and hash mode; the partitions (at most StatusMaxPartitions) with
// their owner and stored offset read from etcd, the offset this replica
// applied and the difference, its lag in records; and a lookup form
// (model, and token ids or, with kind=hashes, hex block hashes) whose
// answer lists per endpoint the matched prefix and its tiers. The lookup
// goes through Lookup's own validation and limits, and is not counted in
// kvindex_indexd_requests_total. Only GET and HEAD are served.
func (s *Server) StatusHandler() http.Handler {
	return http.HandlerFunc(s.serveStatus)
}

// statusPage is the template's data.
type statusPage struct {
	Now       time.Time
	Revision  int64
	Progress  string
	Ready     bool
	NotReady  string
	Prefix    string
	Models    []statusModel
	MoreModel int
	Model     string // the model filter (and the form's model)
	Groups    []statusGroup
	Total     int
	First     int // 1-based index of the page's first endpoint
	Last      int
	Next      string // page token of the next page, "" on the last
	PageSize  int
	Parts     []statusPartition
	MoreParts int
	PartsErr  string
	Form      statusForm
	Result    *statusResult
}

type statusModel struct {
	Name      string
	Endpoints int
	Blocks    [tier.Count]uint64
}

type statusGroup struct {
	Model string
	Rows  []statusEndpoint
}

type statusEndpoint struct {
	Pod       string
	Rank      uint32
	Blocks    [tier.Count]uint64
	Bars      [tier.Count]float64 // percent of the page's largest total
	Record    bool
	LastSeen  string
	Age       string
	BlockSize uint32
	Partition int32
	Mode      string
}

type statusPartition struct {
	Topic     string
	Partition int32
	Owner     string
	Claimed   string
	Stored    string // etcd's offsets/ value, "" when absent
	Applied   string // this replica's applied next offset, "" when unknown
	Lag       string
}

type statusForm struct {
	Model string
	Query string
	Kind  string // "tokens" or "hashes"
}

type statusResult struct {
	Err      string
	Blocks   int // blocks (hashes) or tokens asked
	Unit     string
	Revision int64
	Matches  []statusMatch
}

type statusMatch struct {
	Pod       string
	Rank      uint32
	Blocks    int
	BlockSize uint32
	Tiers     string // runs, "gpu×3 cpu×1"
	Bar       []string
}

func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the status page is read-only", http.StatusMethodNotAllowed)
		return
	}
	if len(r.URL.RawQuery) > StatusMaxQueryBytes {
		http.Error(w, fmt.Sprintf("query is %d bytes, the limit is %d", len(r.URL.RawQuery), StatusMaxQueryBytes), http.StatusRequestURITooLong)
		return
	}
	q := r.URL.Query()
	page, err := s.statusData(r.Context(), q.Get("model"), q.Get("after"), q.Get("page_size"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	page.Form = statusForm{Model: q.Get("lookup_model"), Query: q.Get("q"), Kind: q.Get("kind")}
	if page.Form.Kind != "hashes" {
		page.Form.Kind = "tokens"
	}
	if page.Form.Model == "" {
		page.Form.Model = page.Model
	}
	if q.Has("q") {
		page.Result = s.statusLookup(r.Context(), page.Form)
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	// Nothing but the page itself: inline styles, no scripts, forms to
	// this page only.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	if err := statusTmpl.Execute(w, page); err != nil {
		s.cfg.Logger.Warn("status page: rendering", "err", err)
	}
}

// statusData reads everything but the lookup form's answer.
func (s *Server) statusData(ctx context.Context, model, after, pageSize string) (*statusPage, error) {
	size := DefaultStatusPageSize
	if pageSize != "" {
		n, err := strconv.Atoi(pageSize)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("page_size %q: want a positive integer", pageSize)
		}
		size = min(n, s.cfg.MaxListPageSize)
	}
	if model != "" {
		if err := keyspace.ValidateName("model", model); err != nil {
			return nil, err
		}
	}
	var from *keyspace.Endpoint
	if after != "" {
		ep, err := decodePageToken(after)
		if err != nil {
			return nil, err
		}
		if model != "" && ep.Model != model {
			// As ListEndpoints refuses it: the page would be empty.
			return nil, fmt.Errorf("%w: after continues a list of another model than %q", ErrInvalidArgument, model)
		}
		from = &ep
	}
	now := s.cfg.Clock.Now()
	p := &statusPage{Now: now, Model: model, PageSize: size, Prefix: s.cfg.Keyspace.Prefix()}
	if err := s.Ready(); err != nil {
		p.NotReady = err.Error()
	} else {
		p.Ready = true
	}
	if age := s.refl.progressAge(); age > 0 {
		p.Progress = age.Round(time.Millisecond).String()
	}
	ix := s.refl.current()
	var applied []index.PartitionOffset
	if ix != nil {
		// Every endpoint once, for the model summary and the page: the
		// same O(n log n) cost a ListEndpoints page has.
		all, rev := ix.ListEndpoints("")
		p.Revision = rev
		p.Models, p.MoreModel = summarize(all)
		if model != "" {
			lo, _ := slices.BinarySearchFunc(all, model, func(e index.EndpointInfo, m string) int { return strings.Compare(e.Endpoint.Model, m) })
			hi := lo
			for hi < len(all) && all[hi].Endpoint.Model == model {
				hi++
			}
			all = all[lo:hi]
		}
		p.Total = len(all)
		start := 0
		if from != nil {
			start, _ = slices.BinarySearchFunc(all, *from, func(e index.EndpointInfo, t keyspace.Endpoint) int {
				if c := keyspace.CompareEndpoints(e.Endpoint, t); c <= 0 {
					return -1
				}
				return 1
			})
		}
		end := min(start+size, len(all))
		p.First, p.Last = start+1, end
		if end < len(all) {
			p.Next = encodePageToken(all[end-1].Endpoint)
		}
		p.Groups = groupEndpoints(all[start:end], now)
		// An empty Lookup answers the applied offsets of the same kind of
		// consistent read every Lookup makes.
		sc := s.pool.Get().(*index.Scratch)
		ix.Lookup(sc, "", nil, nil)
		applied = slices.Clone(sc.Offsets)
		s.pool.Put(sc)
	}
	p.Parts, p.MoreParts, p.PartsErr = s.statusPartitions(ctx, applied)
	return p, nil
}

// summarize counts endpoints and blocks per model (all is ordered by
// model), keeping the first StatusMaxModels models.
func summarize(all []index.EndpointInfo) ([]statusModel, int) {
	var out []statusModel
	more := 0
	for _, e := range all {
		if n := len(out); n == 0 || out[n-1].Name != e.Endpoint.Model {
			if n == StatusMaxModels {
				more++
				continue
			}
			out = append(out, statusModel{Name: e.Endpoint.Model})
		}
		m := &out[len(out)-1]
		m.Endpoints++
		for t := range m.Blocks {
			m.Blocks[t] += e.Blocks[t]
		}
	}
	return out, more
}

// groupEndpoints renders one page of endpoints, grouped by model, with
// bars scaled to the page's largest total.
func groupEndpoints(eps []index.EndpointInfo, now time.Time) []statusGroup {
	var largest uint64
	for _, e := range eps {
		largest = max(largest, e.Blocks[0]+e.Blocks[1]+e.Blocks[2])
	}
	var out []statusGroup
	for _, e := range eps {
		if n := len(out); n == 0 || out[n-1].Model != e.Endpoint.Model {
			out = append(out, statusGroup{Model: e.Endpoint.Model})
		}
		row := statusEndpoint{Pod: e.Endpoint.Pod, Rank: e.Endpoint.Rank, Blocks: e.Blocks, Record: e.Record,
			BlockSize: e.BlockSize, Partition: e.Partition, Mode: string(e.HashMode)}
		if largest > 0 {
			for t := range row.Bars {
				row.Bars[t] = 100 * float64(e.Blocks[t]) / float64(largest)
			}
		}
		if !e.LastSeen.IsZero() {
			row.LastSeen = e.LastSeen.UTC().Format(time.RFC3339)
			row.Age = now.Sub(e.LastSeen).Round(time.Second).String()
		}
		if row.Mode == "" {
			row.Mode = "-"
		}
		g := &out[len(out)-1]
		g.Rows = append(g.Rows, row)
	}
	return out
}

// statusPartitions joins the replica's applied offsets with etcd's stored
// offsets and owner records, at most StatusMaxPartitions of them. An etcd
// failure is shown, not fatal: the rest of the page comes from memory.
func (s *Server) statusPartitions(ctx context.Context, applied []index.PartitionOffset) ([]statusPartition, int, string) {
	ctx, cancel := context.WithTimeout(ctx, statusEtcdTimeout)
	defer cancel()
	ks := s.cfg.Keyspace
	stored := map[keyspace.Partition]int64{}
	parts := make([]keyspace.Partition, 0, len(applied))
	for _, o := range applied {
		parts = append(parts, o.Partition)
	}
	var errMsg string
	resp, err := s.cfg.Etcd.Get(ctx, ks.OffsetsPrefix(), clientv3.WithRange(keyspace.RangeEnd(ks.OffsetsPrefix())),
		clientv3.WithLimit(StatusMaxPartitions+1), clientv3.WithSerializable())
	if err != nil {
		errMsg = "reading stored offsets from etcd: " + err.Error()
	} else {
		for _, kv := range resp.Kvs {
			p, err := ks.ParseOffsetKey(string(kv.Key))
			if err != nil {
				continue
			}
			if n, err := keyspace.ParseOffset(kv.Value); err == nil {
				stored[p] = n
			}
			if !slices.Contains(parts, p) {
				parts = append(parts, p)
			}
		}
	}
	slices.SortFunc(parts, func(a, b keyspace.Partition) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	more := 0
	if len(parts) > StatusMaxPartitions {
		more = len(parts) - StatusMaxPartitions
		parts = parts[:StatusMaxPartitions]
	}
	owners := map[keyspace.Partition]keyspace.OwnerRecord{}
	if errMsg == "" && len(parts) > 0 {
		// One serializable read per partition, in one round trip.
		ops := make([]clientv3.Op, len(parts))
		for i, p := range parts {
			ops[i] = clientv3.OpGet(ks.OwnerKey(p), clientv3.WithSerializable())
		}
		for lo := 0; lo < len(ops) && errMsg == ""; lo += 64 {
			hi := min(lo+64, len(ops))
			tr, err := s.cfg.Etcd.Txn(ctx).Then(ops[lo:hi]...).Commit()
			if err != nil {
				errMsg = "reading owners from etcd: " + err.Error()
				break
			}
			for i, r := range tr.Responses {
				if kvs := r.GetResponseRange().GetKvs(); len(kvs) == 1 {
					if rec, err := keyspace.UnmarshalOwnerRecord(kvs[0].Value); err == nil {
						owners[parts[lo+i]] = rec
					}
				}
			}
		}
	}
	out := make([]statusPartition, len(parts))
	for i, p := range parts {
		row := statusPartition{Topic: p.Topic, Partition: p.Partition}
		if rec, ok := owners[p]; ok {
			row.Owner = rec.Ingester
			if row.Owner == "" {
				row.Owner = rec.MemberID
			}
			row.Owner += " (generation " + strconv.Itoa(int(rec.Generation)) + ")"
			if !rec.Claimed.IsZero() {
				row.Claimed = rec.Claimed.UTC().Format(time.RFC3339)
			}
		}
		st, hasStored := stored[p]
		if hasStored {
			row.Stored = strconv.FormatInt(st, 10)
		}
		j := slices.IndexFunc(applied, func(o index.PartitionOffset) bool { return o.Partition == p })
		if j >= 0 {
			row.Applied = strconv.FormatInt(applied[j].Next, 10)
		}
		if hasStored && j >= 0 {
			row.Lag = strconv.FormatInt(max(st-applied[j].Next, 0), 10)
		}
		out[i] = row
	}
	return out, more, errMsg
}

// statusLookup answers the lookup form through Lookup's validation.
func (s *Server) statusLookup(ctx context.Context, f statusForm) *statusResult {
	res := &statusResult{}
	req := &kvindexv1.LookupRequest{Model: f.Model}
	fields := strings.FieldsFunc(f.Query, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' })
	if f.Kind == "hashes" {
		res.Unit = "blocks"
		if len(fields) > s.cfg.MaxHashes {
			res.Err = fmt.Sprintf("%d hashes, the limit is %d (--max-hashes)", len(fields), s.cfg.MaxHashes)
			return res
		}
		for _, h := range fields {
			v, err := keyspace.ParseHashText(h)
			if err != nil {
				res.Err = fmt.Sprintf("%q is not a hex block hash", h)
				return res
			}
			req.BlockHashes = append(req.BlockHashes, v)
		}
		res.Blocks = len(req.BlockHashes)
	} else {
		res.Unit = "tokens"
		if len(fields) > s.cfg.MaxTokens {
			res.Err = fmt.Sprintf("%d token ids, the limit is %d (--max-tokens)", len(fields), s.cfg.MaxTokens)
			return res
		}
		ids := make([]uint32, 0, len(fields))
		for _, t := range fields {
			v, err := strconv.ParseUint(t, 10, 32)
			if err != nil {
				res.Err = fmt.Sprintf("%q is not a token id", t)
				return res
			}
			ids = append(ids, uint32(v))
		}
		req.Tokens = &kvindexv1.TokenPrompt{TokenIds: ids}
		res.Blocks = len(ids)
	}
	resp, err := s.lookup(ctx, req)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	res.Revision = resp.Revision
	for _, m := range resp.Matches {
		sm := statusMatch{Pod: m.GetEndpoint().GetPod(), Rank: m.GetEndpoint().GetDpRank(), Blocks: int(m.MatchedBlocks), BlockSize: m.BlockSize}
		ts := make([]tier.Tier, len(m.Tiers))
		for i, t := range m.Tiers {
			ts[i] = tier.Tier(t)
		}
		sm.Tiers = tier.FormatRuns(ts)
		// One cell per block, up to a bounded width.
		for i, t := range ts {
			if i == statusMaxCells {
				sm.Bar = append(sm.Bar, "more")
				break
			}
			sm.Bar = append(sm.Bar, t.String())
		}
		res.Matches = append(res.Matches, sm)
	}
	return res
}

// statusMaxCells bounds the per-block cells of a lookup answer's bar.
const statusMaxCells = 256

var statusTmpl = template.Must(template.New("status").Funcs(template.FuncMap{
	"pct": func(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) + "%" },
}).Parse(statusHTML))

const statusHTML = `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvindex indexd status</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d232b;background:#fafbfc}
h1{font-size:1.4em;margin:0 0 .4em}h2{font-size:1.15em;margin:1.4em 0 .4em;border-bottom:1px solid #d5dae1}
h3{font-size:1em;margin:1em 0 .3em;font-family:ui-monospace,monospace}
table{border-collapse:collapse;margin:.3em 0}th,td{padding:.2em .6em;text-align:left;border-bottom:1px solid #e3e7ec;vertical-align:middle}
th{background:#eef1f5;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
code,.m{font-family:ui-monospace,monospace}
.ok{color:#17713a;font-weight:600}.bad{color:#b3261e;font-weight:600}
.bar{display:flex;width:16em;height:.9em;background:#eef1f5;border-radius:2px;overflow:hidden}
.bar span{display:block;height:100%}
.gpu{background:#2f6fd6}.cpu{background:#e59a1c}.disk{background:#7a5aa8}.more{background:#9aa3ad}
.cells{display:flex;flex-wrap:wrap;max-width:40em}.cells span{width:.55em;height:.9em;margin:0 1px 1px 0}
.legend span{display:inline-block;width:.8em;height:.8em;margin:0 .2em 0 .8em;vertical-align:middle}
.err{color:#b3261e}form input[type=text]{width:32em}form textarea{width:40em;height:4em}
dl{display:grid;grid-template-columns:max-content auto;gap:.1em 1em}dt{font-weight:600}dd{margin:0}
</style></head><body>
<h1>kvindex indexd</h1>
<section id="replica"><h2>This replica</h2>
<dl>
<dt>Readiness</dt><dd id="ready">{{if .Ready}}<span class="ok">ready</span>{{else}}<span class="bad">not ready</span>: {{.NotReady}}{{end}}</dd>
<dt>Revision</dt><dd id="revision" class="m">{{.Revision}}</dd>
<dt>Progress age</dt><dd id="progress-age">{{if .Progress}}{{.Progress}}{{else}}no progress yet{{end}}</dd>
<dt>Keyspace prefix</dt><dd class="m">{{.Prefix}}</dd>
<dt>Rendered</dt><dd>{{.Now.UTC.Format "2006-01-02T15:04:05Z07:00"}}</dd>
</dl></section>

<section id="models"><h2>Models</h2>
{{if .Models}}<table><thead><tr><th>Model</th><th>Endpoints</th><th>GPU blocks</th><th>CPU blocks</th><th>Disk blocks</th></tr></thead><tbody>
{{range .Models}}<tr class="model-row"><td class="m"><a href="?model={{.Name}}">{{.Name}}</a></td><td class="n">{{.Endpoints}}</td><td class="n">{{index .Blocks 0}}</td><td class="n">{{index .Blocks 1}}</td><td class="n">{{index .Blocks 2}}</td></tr>
{{end}}</tbody></table>{{if .MoreModel}}<p>and {{.MoreModel}} more endpoints of models not listed.</p>{{end}}
{{else}}<p>No endpoints in the index.</p>{{end}}</section>

<section id="endpoints"><h2>Endpoints{{if .Model}} of <span class="m">{{.Model}}</span> (<a href="?">all models</a>){{end}}</h2>
<p id="page-info">{{if .Total}}{{.First}}–{{.Last}} of <span id="total">{{.Total}}</span>{{else}}<span id="total">0</span> endpoints{{end}}
{{if .Next}} · <a id="next" href="?model={{.Model}}&amp;after={{.Next}}&amp;page_size={{.PageSize}}">next {{.PageSize}}</a>{{end}}</p>
<p class="legend">Blocks per tier:<span class="gpu"></span>gpu<span class="cpu"></span>cpu<span class="disk"></span>disk</p>
{{range .Groups}}<h3>{{.Model}}</h3>
<table class="eps" data-model="{{.Model}}"><thead><tr><th>Pod</th><th>Rank</th><th>Blocks</th><th>GPU</th><th>CPU</th><th>Disk</th><th>Block size</th><th>Partition</th><th>Hash mode</th><th>Last heard</th></tr></thead><tbody>
{{range .Rows}}<tr class="ep"><td class="m pod">{{.Pod}}</td><td class="n rank">{{.Rank}}</td>
<td><div class="bar" title="gpu {{index .Blocks 0}}, cpu {{index .Blocks 1}}, disk {{index .Blocks 2}}"><span class="gpu" style="width:{{pct (index .Bars 0)}}"></span><span class="cpu" style="width:{{pct (index .Bars 1)}}"></span><span class="disk" style="width:{{pct (index .Bars 2)}}"></span></div></td>
<td class="n gpu-blocks">{{index .Blocks 0}}</td><td class="n cpu-blocks">{{index .Blocks 1}}</td><td class="n disk-blocks">{{index .Blocks 2}}</td>
<td class="n">{{if .Record}}{{.BlockSize}}{{else}}-{{end}}</td><td class="n">{{if .Record}}{{.Partition}}{{else}}-{{end}}</td><td class="mode">{{.Mode}}</td>
<td>{{if .LastSeen}}{{.LastSeen}} ({{.Age}} ago){{else}}no record{{end}}</td></tr>
{{end}}</tbody></table>
{{end}}</section>

<section id="partitions"><h2>Partitions</h2>
{{if .PartsErr}}<p class="err">{{.PartsErr}}</p>{{end}}
{{if .Parts}}<table><thead><tr><th>Topic</th><th>Partition</th><th>Owner</th><th>Claimed</th><th>Stored next offset (etcd)</th><th>Applied next offset (this replica)</th><th>Replica lag (records)</th></tr></thead><tbody>
{{range .Parts}}<tr class="part"><td class="m">{{.Topic}}</td><td class="n">{{.Partition}}</td><td class="m">{{if .Owner}}{{.Owner}}{{else}}none{{end}}</td><td>{{.Claimed}}</td><td class="n stored">{{.Stored}}</td><td class="n applied">{{.Applied}}</td><td class="n lag">{{.Lag}}</td></tr>
{{end}}</tbody></table>{{if .MoreParts}}<p>and {{.MoreParts}} more partitions not shown.</p>{{end}}
<p>Kafka lag (records behind the high watermark) is the ingester's kvindex_ingester_lag_records.</p>
{{else}}<p>No partition offsets stored yet.</p>{{end}}</section>

<section id="lookup"><h2>Lookup</h2>
<form method="get" action="" id="lookup-form">
<p><label>Model <input type="text" name="lookup_model" value="{{.Form.Model}}"></label></p>
<p><label><input type="radio" name="kind" value="tokens"{{if eq .Form.Kind "tokens"}} checked{{end}}> token ids</label>
<label><input type="radio" name="kind" value="hashes"{{if eq .Form.Kind "hashes"}} checked{{end}}> hex block hashes (engine mode)</label></p>
<p><textarea name="q" placeholder="128000, 9906, 1917 … or e5068d13bba8906f 1c92a7b9b9bec94f …">{{.Form.Query}}</textarea></p>
<p><button type="submit">Look up</button></p>
</form>
{{with .Result}}<div id="result">
{{if .Err}}<p class="err">{{.Err}}</p>{{else}}
<p>{{.Blocks}} {{.Unit}} asked; answered at revision <span class="m">{{.Revision}}</span>; {{len .Matches}} endpoints matched.</p>
{{if .Matches}}<table><thead><tr><th>Pod</th><th>Rank</th><th>Matched blocks</th><th>Block size</th><th>Tiers</th><th></th></tr></thead><tbody>
{{range .Matches}}<tr class="match"><td class="m pod">{{.Pod}}</td><td class="n rank">{{.Rank}}</td><td class="n blocks">{{.Blocks}}</td><td class="n">{{.BlockSize}}</td><td class="tiers">{{.Tiers}}</td>
<td><div class="cells">{{range .Bar}}<span class="{{.}}"></span>{{end}}</div></td></tr>
{{end}}</tbody></table>{{end}}{{end}}
</div>{{end}}</section>
</body></html>
`
