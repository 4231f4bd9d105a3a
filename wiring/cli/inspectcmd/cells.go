package inspectcmd

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/client/cellmap"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

// A cell map names each cell's indexd, never its etcd cluster (one cell
// map is shared with routers, which must not need etcd), so with
// --cell-map inspect reads each cell through its indexd's ListEndpoints:
// the endpoint listing only. Chunk and key-level views (blocks, chunks,
// models, and the problems of keys that do not parse) need the cell's own
// etcd and stay per cell.

// errCellsEtcdOnly is why blocks, chunks and models refuse --cell-map.
const errCellsEtcdOnly = "--cell-map works with endpoints only: blocks, chunks and models read one cell's etcd " +
	"(the cell map names each cell's indexd, not its etcd); run them per cell with that cell's --etcd-endpoints " +
	"(inspect endpoints --cell-map says each endpoint's cell)"

// cellEndpoints is the endpoint listing of every cell a scope reads.
type cellEndpoints struct {
	cells     []cellSummary
	endpoints []cellEndpointJSON
}

// cellSummary is what one cell answered.
type cellSummary struct {
	Cell   string `json:"cell"`
	Indexd string `json:"indexd"`
	Topic  string `json:"topic"`
	// Endpoints counts the cell's endpoints in scope.
	Endpoints int `json:"endpoints"`
	// Revision and MaxRevision are the lowest and highest etcd revision
	// of the cell's pages (equal unless the cell's index changed while
	// they were read); revisions of two cells do not compare.
	Revision    int64 `json:"revision"`
	MaxRevision int64 `json:"max_revision"`
	Pages       int   `json:"pages"`
}

// cellEndpointJSON is one endpoint as its cell's indexd lists it: the
// fields of an etcd endpoint record indexd serves, its blocks per tier
// instead of leases and chunk_next.
type cellEndpointJSON struct {
	Cell       string            `json:"cell"`
	Model      string            `json:"model"`
	Pod        string            `json:"pod"`
	Rank       uint32            `json:"rank"`
	HashMode   string            `json:"hash_mode"`
	BlockSize  uint32            `json:"block_size"`
	Partition  int32             `json:"partition"`
	LastRecord *time.Time        `json:"last_record"`
	Blocks     map[string]uint64 `json:"blocks"`
}

// runCellEndpoints lists the endpoints in scope of every cell the map
// reads them from (every cell, or --model's read cells), each cell paged
// through its own indexd in pages of --page-size, in map order.
func (o *options) runCellEndpoints(cmd *cobra.Command) error {
	if err := o.check(cmd); err != nil {
		return err
	}
	for _, f := range []string{"etcd-endpoints", "etcd-prefix", "etcd-cacert", "etcd-cert", "etcd-key", "etcd-username", "etcd-password-file", "etcd-dial-timeout", "list-concurrency"} {
		if cmd.Flags().Changed(f) {
			return usagef("--%s is for one cell's etcd; --cell-map reads each cell through its indexd (give the --tls-* flags for indexd)", f)
		}
	}
	m, err := cellmap.Load(o.cellMap)
	if err != nil {
		return usagef("--cell-map: %v", err)
	}
	opts, err := o.tls.Options()
	if err != nil {
		return usagef("%v", err)
	}
	names, err := o.cellsInScope(m)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	out := &cellEndpoints{cells: []cellSummary{}, endpoints: []cellEndpointJSON{}}
	for _, name := range names {
		cell, _ := m.Cell(name)
		if err := o.listCell(ctx, cell, opts, out); err != nil {
			return err
		}
	}
	return writeCellEndpoints(cmd.OutOrStdout(), o.output, out)
}

// cellsInScope are the cells a listing reads: every cell, or the read
// cells of --model (the cells routers ask for it: its write cells and,
// during a move, its readAlso cells).
func (o *options) cellsInScope(m *cellmap.Map) ([]string, error) {
	if o.model == "" {
		var names []string
		for _, c := range m.Cells() {
			names = append(names, c.Name)
		}
		return names, nil
	}
	r, err := m.Route(o.model)
	if err != nil {
		return nil, usagef("--model %q: %v", o.model, err)
	}
	return r.Read, nil
}

// listCell pages through one cell's endpoints. A cell that does not answer
// fails the command, naming the cell: an operator's listing must not look
// complete when it is not.
func (o *options) listCell(ctx context.Context, cell cellmap.Cell, opts []client.Option, out *cellEndpoints) error {
	cl, err := client.New(cell.Indexd, append(opts, client.WithTimeout(o.timeout))...)
	if err != nil {
		return fmt.Errorf("cell %s: %w", cell.Name, err)
	}
	defer cl.Close()
	sum := cellSummary{Cell: cell.Name, Indexd: cell.Indexd, Topic: cell.Topic}
	token := ""
	for {
		page, err := cl.ListEndpointsPage(ctx, o.model, o.pageSize, token)
		if err != nil {
			return fmt.Errorf("cell %s: %w", cell.Name, err)
		}
		sum.Pages++
		if sum.Pages == 1 || page.Revision < sum.Revision {
			sum.Revision = page.Revision
		}
		sum.MaxRevision = max(sum.MaxRevision, page.Revision)
		for _, e := range page.Endpoints {
			if o.pod != "" && e.Endpoint.Pod != o.pod {
				continue
			}
			j := cellEndpointJSON{Cell: cell.Name, Model: e.Model, Pod: e.Endpoint.Pod, Rank: e.Endpoint.DPRank,
				HashMode: e.HashMode.String(), BlockSize: e.BlockSize, Partition: e.Partition,
				Blocks: map[string]uint64{"gpu": e.GPUBlocks, "cpu": e.CPUBlocks, "disk": e.DiskBlocks}}
			if !e.LastSeen.IsZero() {
				t := e.LastSeen.UTC()
				j.LastRecord = &t
			}
			out.endpoints = append(out.endpoints, j)
			sum.Endpoints++
		}
		if page.NextPageToken == "" {
			break
		}
		if page.NextPageToken == token {
			return fmt.Errorf("cell %s: indexd returned the same page token twice", cell.Name)
		}
		token = page.NextPageToken
	}
	out.cells = append(out.cells, sum)
	return nil
}

func writeCellEndpoints(w io.Writer, output string, l *cellEndpoints) error {
	if output == "json" {
		return writeJSON(w, struct {
			Cells     []cellSummary      `json:"cells"`
			Endpoints []cellEndpointJSON `json:"endpoints"`
		}{l.cells, l.endpoints})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CELL\tMODEL\tPOD\tRANK\tHASH_MODE\tBLOCK_SIZE\tPARTITION\tLAST_RECORD\tGPU\tCPU\tDISK")
	for _, e := range l.endpoints {
		last := "-"
		if e.LastRecord != nil {
			last = e.LastRecord.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\t%d\t%d\t%d\n", e.Cell, common.Display(e.Model), common.Display(e.Pod), e.Rank,
			e.HashMode, e.BlockSize, e.Partition, last, e.Blocks["gpu"], e.Blocks["cpu"], e.Blocks["disk"])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, c := range l.cells {
		rev := "revision " + strconv.FormatInt(c.Revision, 10)
		if c.MaxRevision > c.Revision {
			rev = fmt.Sprintf("revisions %d to %d", c.Revision, c.MaxRevision)
		}
		if _, err := fmt.Fprintf(w, "cell %s: %d endpoints at %s (indexd %s, topic %s)\n", c.Cell, c.Endpoints, rev,
			common.Display(c.Indexd), common.Display(c.Topic)); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "%s in %s\n", plural(len(l.endpoints), "endpoint"), plural(len(l.cells), "cell"))
	return err
}
