// Package cellscmd is `kvindex cells`: check a cell map, and move a model
// between cells step by step (docs/DESIGN.md "Moving a model between
// cells"): map both, flip, drain and verify, finish.
package cellscmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/client/cellmap"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

// Steps of a move (Move).
const (
	// StepBoth keeps the model's write cells and adds the target to the
	// cells routers read (readAlso).
	StepBoth = "both"
	// StepFlip makes the target the only write cell and the old write
	// cells read-only (readAlso): bridges move their endpoints.
	StepFlip = "flip"
	// StepFinish drops the old cells from the reads, once Verify says
	// they are drained.
	StepFinish = "finish"
)

// ErrStep is a move step that does not follow from the map as it is.
var ErrStep = errors.New("cells: move step out of order")

// Move returns f with model's rule changed by step toward cell to. A
// model that has no exact rule gets one (placed first, so it wins over
// globs), written from the route it has now.
func Move(f cellmap.File, model, to, step string) (cellmap.File, error) {
	m, err := cellmap.Parse(cellmap.Format(f))
	if err != nil {
		return f, err
	}
	if _, ok := m.Cell(to); !ok {
		return f, fmt.Errorf("cells: unknown cell %q", to)
	}
	i := slices.IndexFunc(f.Models, func(r cellmap.Rule) bool { return r.Match == model })
	if i < 0 {
		r, err := m.Route(model)
		if err != nil {
			return f, err
		}
		f.Models = append([]cellmap.Rule{{Match: model, Cells: r.Write}}, f.Models...)
		i = 0
	}
	r := &f.Models[i]
	switch step {
	case StepBoth:
		if slices.Equal(r.Cells, []string{to}) {
			return f, fmt.Errorf("%w: %s is already written to %s only", ErrStep, model, to)
		}
		if slices.Contains(r.Cells, to) {
			return f, fmt.Errorf("%w: %s is spread over %v, %s among them; moving within a spread is not a move", ErrStep, model, r.Cells, to)
		}
		if !slices.Contains(r.ReadAlso, to) {
			r.ReadAlso = append(r.ReadAlso, to)
		}
	case StepFlip:
		if !slices.Contains(r.ReadAlso, to) {
			return f, fmt.Errorf("%w: routers do not read %s for %s yet (run step %s first)", ErrStep, to, model, StepBoth)
		}
		old := r.Cells
		r.Cells = []string{to}
		r.ReadAlso = slices.DeleteFunc(r.ReadAlso, func(c string) bool { return c == to })
		for _, c := range old {
			if !slices.Contains(r.ReadAlso, c) {
				r.ReadAlso = append(r.ReadAlso, c)
			}
		}
	case StepFinish:
		if !slices.Equal(r.Cells, []string{to}) {
			return f, fmt.Errorf("%w: %s is written to %v, not %s alone (run step %s first)", ErrStep, model, r.Cells, to, StepFlip)
		}
		r.ReadAlso = nil
	default:
		return f, fmt.Errorf("cells: unknown step %q (want %s, %s or %s)", step, StepBoth, StepFlip, StepFinish)
	}
	if _, err := cellmap.Parse(cellmap.Format(f)); err != nil {
		return f, err
	}
	return f, nil
}

// Report is what Verify found of one model across the cells it is read
// from.
type Report struct {
	// Endpoints maps "pod/rank" to the cells listing it.
	Endpoints map[string][]string
	// Doubled are endpoints listed in more than one cell.
	Doubled []string
	// Misplaced are endpoints listed in a cell other than their write
	// cell (not yet drained after a flip).
	Misplaced []string
}

// Drained reports whether every endpoint is in its write cell only.
func (r Report) Drained() bool { return len(r.Doubled) == 0 && len(r.Misplaced) == 0 }

// Verify lists model's endpoints in every cell routers read it from (c
// must be a cell-mode client over m) and reports where each is.
func Verify(ctx context.Context, c *client.Client, m *cellmap.Map, model string) (Report, error) {
	route, err := m.Route(model)
	if err != nil {
		return Report{}, err
	}
	l, err := c.ListEndpoints(ctx, model)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Endpoints: map[string][]string{}}
	for _, e := range l.Endpoints {
		if e.Model != model {
			continue
		}
		key := fmt.Sprintf("%s/%d", e.Endpoint.Pod, e.Endpoint.DPRank)
		rep.Endpoints[key] = append(rep.Endpoints[key], e.Cell)
		if e.Cell != cellmap.PodCell(route.Write, e.Endpoint.Pod) {
			rep.Misplaced = append(rep.Misplaced, key+" in "+e.Cell)
		}
	}
	for key, cells := range rep.Endpoints {
		if len(cells) > 1 {
			rep.Doubled = append(rep.Doubled, fmt.Sprintf("%s in %v", key, cells))
		}
	}
	sort.Strings(rep.Doubled)
	sort.Strings(rep.Misplaced)
	return rep, nil
}

// NewCommand returns `kvindex cells`.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cells",
		Short: "Check a cell map and move a model between cells",
		Long: `cells works on a cell map file (docs/DESIGN.md "Cells").

  cells validate FILE                          parse the map strictly, print every rule
  cells move FILE --model M --to CELL --step S print (or --write) the map after step S:
      both    routers read CELL too; producers still write the old cells
      flip    producers write CELL; routers still read the old cells
      finish  routers read CELL only (after verify reports drained)
  cells verify FILE --model M                  list M's endpoints in every cell it is read
                                               from; fail unless each is in its write cell only

A move is: move --step both, apply the map and wait for every router and
bridge to reload it; move --step flip, apply; verify until it reports
drained (bridges move each endpoint at its next record, a heartbeat at the
latest); move --step finish, apply.`,
	}
	cmd.AddCommand(validateCommand(), moveCommand(), verifyCommand())
	return cmd
}

func validateCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "Parse a cell map strictly and print its rules",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := cellmap.Load(args[0])
			if err != nil {
				return err
			}
			return describe(cmd.OutOrStdout(), m)
		},
	}
}

func describe(w io.Writer, m *cellmap.Map) error {
	f := m.File()
	for _, c := range f.Cells {
		fmt.Fprintf(w, "cell %s: indexd %s, topic %s", c.Name, c.Indexd, c.Topic)
		if len(c.Brokers) > 0 {
			fmt.Fprintf(w, ", brokers %v", c.Brokers)
		}
		fmt.Fprintln(w)
	}
	for _, r := range f.Models {
		kind := "written to"
		if len(r.Cells) > 1 {
			kind = "spread by pod over"
		}
		fmt.Fprintf(w, "model %q: %s %v", r.Match, kind, r.Cells)
		if len(r.ReadAlso) > 0 {
			fmt.Fprintf(w, ", also read from %v (moving)", r.ReadAlso)
		}
		fmt.Fprintln(w)
	}
	if f.Default != "" {
		fmt.Fprintf(w, "any other model: %s\n", f.Default)
	} else {
		fmt.Fprintln(w, "any other model: no cell (refused)")
	}
	return nil
}

func moveCommand() *cobra.Command {
	var model, to, step string
	var write bool
	cmd := &cobra.Command{
		Use:   "move FILE --model M --to CELL --step both|flip|finish",
		Short: "Print (or write) the cell map after one step of moving a model",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := cellmap.Load(args[0])
			if err != nil {
				return err
			}
			f, err := Move(m.File(), model, to, step)
			if err != nil {
				return err
			}
			out := cellmap.Format(f)
			if !write {
				_, err := cmd.OutOrStdout().Write(out)
				return err
			}
			return writeAtomic(args[0], out)
		},
	}
	cmd.Flags().StringVar(&model, "model", "", "the model to move (required)")
	cmd.Flags().StringVar(&to, "to", "", "the cell to move it to (required)")
	cmd.Flags().StringVar(&step, "step", "", "both, flip or finish (required)")
	cmd.Flags().BoolVar(&write, "write", false, "replace FILE (atomically: a temporary file renamed over it) instead of printing")
	for _, f := range []string{"model", "to", "step"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

// writeAtomic replaces path with data by renaming a temporary file of the
// same directory over it, so a watcher never reads half a map.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".cells-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func verifyCommand() *cobra.Command {
	var model string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "verify FILE --model M",
		Short: "Check that each endpoint of a model is in its write cell only",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := common.CheckPositive(cmd.Flags(), "timeout"); err != nil {
				return err
			}
			m, err := cellmap.Load(args[0])
			if err != nil {
				return err
			}
			c, err := client.New("", client.WithCells(m), client.WithTimeout(timeout))
			if err != nil {
				return err
			}
			defer c.Close()
			rep, err := Verify(cmd.Context(), c, m, model)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%d endpoints of %q\n", len(rep.Endpoints), model)
			for _, d := range rep.Doubled {
				fmt.Fprintf(w, "doubled: %s\n", d)
			}
			for _, d := range rep.Misplaced {
				fmt.Fprintf(w, "not drained: %s\n", d)
			}
			if !rep.Drained() {
				return fmt.Errorf("cells: %q is not drained: %d doubled, %d outside their write cell", model, len(rep.Doubled), len(rep.Misplaced))
			}
			fmt.Fprintln(w, "drained: every endpoint is in its write cell only")
			return nil
		},
	}
	cmd.Flags().StringVar(&model, "model", "", "the model to check (required)")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "per-call deadline")
	_ = cmd.MarkFlagRequired("model")
	return cmd
}
