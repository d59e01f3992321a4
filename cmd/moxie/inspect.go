package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"moxie/checkpoint"
	"moxie/dsv4/config"
	"moxie/internal/progress"
)

func runInspect(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("inspect", "MODEL", `
List a model's tensors grouped by role (embedding and head, attention, compressor
and indexer, hyper-connections, router, shared expert, routed experts, MTP), with
counts, stored formats and bytes; the totals; and the weight bytes one decoded
token reads at batch 1. Reads headers only (a synthetic model generates nothing).`, stderr)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("want exactly one MODEL (a checkpoint directory or synth:PRESET), got %d arguments", fs.NArg())
	}
	src, err := checkpoint.Open(fs.Arg(0))
	if err != nil {
		return err
	}
	defer src.Close()
	rep, err := inspect(src)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.print(stdout)
	return nil
}

// roleSummary is one row of the inspect report.
type roleSummary struct {
	Role    string         `json:"role"`
	Tensors int            `json:"tensors"`
	Formats map[string]int `json:"formats"`
	Bytes   int64          `json:"bytes"`
}

type inspectReport struct {
	Model         string        `json:"model"`
	Synthetic     bool          `json:"synthetic"`
	Config        string        `json:"config"`
	Roles         []roleSummary `json:"roles"`
	Tensors       int           `json:"tensors"`
	Bytes         int64         `json:"bytes"`
	BytesPerToken int64         `json:"bytes_per_token"`
	Unknown       []string      `json:"unknown_tensors,omitempty"`
	Missing       []string      `json:"missing_tensors,omitempty"`
}

// inspect groups a source's tensors by the role the V4 layout gives them and
// counts the weight bytes a decoded token reads.
func inspect(src checkpoint.Source) (*inspectReport, error) {
	cfgJSON, err := src.File("config.json")
	if err != nil {
		return nil, err
	}
	cfg, err := config.Parse(cfgJSON)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src.Name(), err)
	}
	layout := map[string]config.Tensor{}
	for _, t := range config.Layout(cfg) {
		layout[t.Name] = t
	}
	rep := &inspectReport{Model: src.Name(), Synthetic: src.Synthetic(), Config: describeConfig(cfg)}
	rows := make([]roleSummary, len(config.Roles()))
	for _, r := range config.Roles() {
		rows[r] = roleSummary{Role: r.String(), Formats: map[string]int{}}
	}
	other := roleSummary{Role: "not in the V4 layout", Formats: map[string]int{}}
	present := map[string]bool{}
	for _, ti := range src.Tensors() {
		present[ti.Name] = true
		row := &other
		if t, ok := layout[ti.Name]; ok {
			row = &rows[t.Role]
		} else {
			rep.Unknown = append(rep.Unknown, ti.Name)
		}
		row.Tensors++
		row.Formats[ti.DType.String()]++
		row.Bytes += ti.Size
		rep.Tensors++
		rep.Bytes += ti.Size
	}
	for name := range layout {
		if !present[name] {
			rep.Missing = append(rep.Missing, name)
		}
	}
	sort.Strings(rep.Missing)
	rep.Roles = rows
	if other.Tensors > 0 {
		rep.Roles = append(rep.Roles, other)
	}
	rep.BytesPerToken = config.BytesPerToken(cfg)
	return rep, nil
}

func describeConfig(c *config.Config) string {
	kinds := map[config.LayerKind]int{}
	for i := range c.NLayers {
		kinds[c.Kind(i)]++
	}
	return fmt.Sprintf("deepseek_v4: %d layers (%d window-only, %d CSA, %d HCA; %d hash-routed), hidden %d, %d heads x %d, %d routed experts top-%d + %d shared, %d MTP block(s), vocab %d, experts %s",
		c.NLayers, kinds[config.Window], kinds[config.CSA], kinds[config.HCA], c.NHashLayers, c.Dim,
		c.NHeads, c.HeadDim, c.NRoutedExperts, c.NActivatedExperts, c.NSharedExperts, c.NMTPLayers, c.VocabSize, c.ExpertDType)
}

func (r *inspectReport) print(w io.Writer) {
	fmt.Fprintf(w, "model:   %s\n", r.Model)
	if r.Synthetic {
		fmt.Fprintf(w, "         SYNTHETIC: random weights, not a trained model\n")
	}
	fmt.Fprintf(w, "config:  %s\n\n", r.Config)
	fmt.Fprintf(w, "%-24s %8s  %-44s %20s %12s\n", "role", "tensors", "formats", "bytes", "")
	for _, row := range r.Roles {
		fmt.Fprintf(w, "%-24s %8d  %-44s %20s %12s\n", row.Role, row.Tensors, formats(row.Formats), commas(row.Bytes), progress.FormatBytes(row.Bytes))
	}
	fmt.Fprintf(w, "%-24s %8d  %-44s %20s %12s\n", "total", r.Tensors, "", commas(r.Bytes), progress.FormatBytes(r.Bytes))
	fmt.Fprintf(w, "\nweight bytes read per decoded token (batch 1, main model): %s (%s)\n", commas(r.BytesPerToken), progress.FormatBytes(r.BytesPerToken))
	if len(r.Missing) > 0 {
		fmt.Fprintf(w, "\nWARNING: %d tensors of the V4 layout are missing, e.g. %s\n", len(r.Missing), strings.Join(r.Missing[:min(3, len(r.Missing))], ", "))
	}
	if len(r.Unknown) > 0 {
		fmt.Fprintf(w, "\nWARNING: %d tensors are not in the V4 layout, e.g. %s\n", len(r.Unknown), strings.Join(r.Unknown[:min(3, len(r.Unknown))], ", "))
	}
}

func formats(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// commas renders n with thousands separators.
func commas(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
