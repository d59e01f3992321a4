package experts

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// FrequencyHeader is the first line of a frequency file.
const FrequencyHeader = "moxie expert frequencies v1"

// Frequencies are per-layer, per-expert non-negative values (use counts from
// a route trace, or saliency scores) that rank experts for a static hot set.
//
// File format (text, UTF-8): the first line is exactly
//
//	moxie expert frequencies v1
//
// then one entry per line, "LAYER EXPERT VALUE", fields separated by spaces or
// tabs: LAYER and EXPERT are decimal integers in 0..65535, VALUE a finite
// non-negative decimal number. Blank lines and lines starting with '#' are
// ignored. A (layer, expert) pair may appear once. Experts not listed have
// value 0. Lines are at most 256 bytes.
type Frequencies struct {
	v map[int]map[int]float64
}

// NewFrequencies returns an empty table.
func NewFrequencies() *Frequencies { return &Frequencies{v: map[int]map[int]float64{}} }

// Set sets the value of expert e in layer l.
func (f *Frequencies) Set(l, e int, v float64) {
	if f.v[l] == nil {
		f.v[l] = map[int]float64{}
	}
	f.v[l][e] = v
}

// Add adds v to the value of expert e in layer l.
func (f *Frequencies) Add(l, e int, v float64) { f.Set(l, e, f.Get(l, e)+v) }

// Get is the value of expert e in layer l (0 if absent).
func (f *Frequencies) Get(l, e int) float64 { return f.v[l][e] }

// Layers lists the layers with entries, ascending.
func (f *Frequencies) Layers() []int {
	var ls []int
	for l := range f.v {
		ls = append(ls, l)
	}
	slices.Sort(ls)
	return ls
}

// Top returns up to n experts of layer l below limit with a positive value,
// highest value first, ties broken by the lower expert index.
func (f *Frequencies) Top(l, n, limit int) []int {
	var es []int
	for e, v := range f.v[l] {
		if v > 0 && e < limit {
			es = append(es, e)
		}
	}
	f.sort(l, es)
	return es[:min(n, len(es))]
}

func (f *Frequencies) sort(l int, es []int) {
	slices.SortFunc(es, func(a, b int) int {
		va, vb := f.v[l][a], f.v[l][b]
		switch {
		case va > vb:
			return -1
		case va < vb:
			return 1
		}
		return a - b
	})
}

// Write writes f in the file format: layers ascending, within a layer by value
// descending (ties: expert ascending). Values are written exactly ('g', -1).
func (f *Frequencies) Write(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, FrequencyHeader)
	fmt.Fprintln(bw, "# layer expert value")
	for _, l := range f.Layers() {
		var es []int
		for e := range f.v[l] {
			es = append(es, e)
		}
		f.sort(l, es)
		for _, e := range es {
			fmt.Fprintf(bw, "%d %d %s\n", l, e, strconv.FormatFloat(f.v[l][e], 'g', -1, 64))
		}
	}
	return bw.Flush()
}

// ParseFrequencies reads a frequency file. Errors name the line and field.
func ParseFrequencies(data []byte) (*Frequencies, error) {
	f := NewFrequencies()
	lines := bytes.Split(data, []byte("\n"))
	if len(lines) == 0 || strings.TrimRight(string(lines[0]), "\r") != FrequencyHeader {
		first := string(lines[0])
		if len(first) > 40 {
			first = first[:40] + "..."
		}
		return nil, fmt.Errorf("line 1 is %q, want %q", first, FrequencyHeader)
	}
	for i, raw := range lines[1:] {
		n := i + 2
		if len(raw) > 256 {
			return nil, fmt.Errorf("line %d is %d bytes, want at most 256", n, len(raw))
		}
		line := strings.TrimSpace(string(raw))
		if line == "" || line[0] == '#' {
			continue
		}
		fs := strings.Fields(line)
		if len(fs) != 3 {
			return nil, fmt.Errorf("line %d has %d fields, want 3 (layer expert value)", n, len(fs))
		}
		var idx [2]int
		for j, name := range []string{"layer", "expert"} {
			v, err := strconv.ParseUint(fs[j], 10, 16)
			if err != nil {
				return nil, fmt.Errorf("line %d: %s %q is not an integer in 0..65535", n, name, fs[j])
			}
			idx[j] = int(v)
		}
		v, err := strconv.ParseFloat(fs[2], 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return nil, fmt.Errorf("line %d: value %q is not a finite non-negative number", n, fs[2])
		}
		if _, dup := f.v[idx[0]][idx[1]]; dup {
			return nil, fmt.Errorf("line %d: layer %d expert %d listed twice", n, idx[0], idx[1])
		}
		f.Set(idx[0], idx[1], v)
	}
	return f, nil
}
