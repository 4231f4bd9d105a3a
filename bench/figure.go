package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Goal is a DESIGN performance goal a figure is held to: the figure's
// ratio (OnRatio) or its value must be at most (AtMost) or at least Target.
type Goal struct {
	Target  float64
	AtMost  bool
	OnRatio bool
}

// String renders the goal as "ratio <= 2" or "value >= 0.8".
func (g Goal) String() string {
	what, op := "value", ">="
	if g.OnRatio {
		what = "ratio"
	}
	if g.AtMost {
		op = "<="
	}
	return what + " " + op + " " + strconv.FormatFloat(g.Target, 'g', -1, 64)
}

// Figure is one measured figure.
type Figure struct {
	// Name says what was measured, in snake_case (lookup_ns_per_hash).
	Name string
	// Labels qualify the run (entries, concurrency, fraction); may be nil.
	Labels map[string]string
	// Value is the measurement, in Unit.
	Value float64
	Unit  string
	// Reference is the same quantity for the reference measured in the
	// same run, in Unit; HasReference says whether there is one.
	Reference    float64
	HasReference bool
	// RefName names the reference (for the text table).
	RefName string
	// Goal, when non-nil, is the DESIGN goal the figure is held to.
	Goal *Goal
}

// Ratio returns Value/Reference, and false without a (non-zero) reference.
func (f Figure) Ratio() (float64, bool) {
	if !f.HasReference || f.Reference == 0 {
		return 0, false
	}
	return f.Value / f.Reference, true
}

// Met reports whether the figure meets its goal; ok is false when it has
// none (or its goal is on a ratio it does not have).
func (f Figure) Met() (met, ok bool) {
	if f.Goal == nil {
		return false, false
	}
	x := f.Value
	if f.Goal.OnRatio {
		r, has := f.Ratio()
		if !has {
			return false, false
		}
		x = r
	}
	if f.Goal.AtMost {
		return x <= f.Goal.Target, true
	}
	return x >= f.Goal.Target, true
}

// figureJSON is the JSON line of a figure (`-o json`): the fields the
// issue fixes (figure, value, unit, reference, ratio, goal, met), null
// where a figure has no reference or goal, plus what qualifies them.
type figureJSON struct {
	Figure    string            `json:"figure"`
	Value     float64           `json:"value"`
	Unit      string            `json:"unit"`
	Reference *float64          `json:"reference"`
	Ratio     *float64          `json:"ratio"`
	Goal      *float64          `json:"goal"`
	Met       *bool             `json:"met"`
	GoalOn    string            `json:"goal_on,omitempty"`
	GoalOp    string            `json:"goal_op,omitempty"`
	RefName   string            `json:"reference_name,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// MarshalJSON renders the figure's JSON line (without the newline).
func (f Figure) MarshalJSON() ([]byte, error) {
	j := figureJSON{Figure: f.Name, Value: clean(f.Value), Unit: f.Unit, Labels: f.Labels}
	if f.HasReference {
		ref := clean(f.Reference)
		j.Reference, j.RefName = &ref, f.RefName
	}
	if r, ok := f.Ratio(); ok {
		r = clean(r)
		j.Ratio = &r
	}
	if f.Goal != nil {
		g := f.Goal.Target
		j.Goal = &g
		j.GoalOn, j.GoalOp = "value", ">="
		if f.Goal.OnRatio {
			j.GoalOn = "ratio"
		}
		if f.Goal.AtMost {
			j.GoalOp = "<="
		}
		if met, ok := f.Met(); ok {
			j.Met = &met
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // goal_op stays "<=" and ">="
	if err := enc.Encode(j); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// clean keeps JSON encodable: NaN and infinities become 0 (a run too short
// to divide by is reported as nothing measured, not as an error).
func clean(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return x
}

// Report is what one bench command measured.
type Report struct {
	// Title heads the text table ("kvindex-bench lookup").
	Title   string
	Figures []Figure
	// Notes are printed under the text table (what was run, on what).
	Notes []string
}

// Add appends figures.
func (r *Report) Add(fs ...Figure) { r.Figures = append(r.Figures, fs...) }

// Notef appends a note.
func (r *Report) Notef(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// WriteJSON writes one JSON object per figure, each on its own line.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, f := range r.Figures {
		if err := enc.Encode(f); err != nil {
			return err
		}
	}
	return nil
}

// WriteText writes the figures as an aligned table, then the notes.
func (r *Report) WriteText(w io.Writer) error {
	if r.Title != "" {
		fmt.Fprintf(w, "%s\n\n", r.Title)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tlabels\tvalue\treference\tratio\tgoal\tmet")
	for _, f := range r.Figures {
		ref, ratio, goal, met := "-", "-", "-", "-"
		if f.HasReference {
			ref = formatNumber(f.Reference) + " " + f.Unit
			if f.RefName != "" {
				ref += " (" + f.RefName + ")"
			}
		}
		if x, ok := f.Ratio(); ok {
			ratio = strconv.FormatFloat(x, 'f', 3, 64)
		}
		if f.Goal != nil {
			goal = f.Goal.String()
		}
		if m, ok := f.Met(); ok {
			met = map[bool]string{true: "yes", false: "NO"}[m]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s %s\t%s\t%s\t%s\t%s\n", f.Name, formatLabels(f.Labels), formatNumber(f.Value), f.Unit, ref, ratio, goal, met)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range r.Notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
	}
	return nil
}

func formatLabels(ls map[string]string) string {
	if len(ls) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(ls))
	for k := range ls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + ls[k]
	}
	return strings.Join(parts, ",")
}

// formatNumber prints x with about four significant digits.
func formatNumber(x float64) string {
	switch ax := math.Abs(x); {
	case ax >= 1e5 || x == math.Trunc(x) && ax < 1e15:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case ax >= 100:
		return strconv.FormatFloat(x, 'f', 1, 64)
	case ax >= 1:
		return strconv.FormatFloat(x, 'f', 3, 64)
	default:
		return strconv.FormatFloat(x, 'g', 4, 64)
	}
}
