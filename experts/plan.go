package experts

import (
	"bufio"
	"bytes"
	"fmt"
	"moxie/internal/progress"
	"os"
	"strconv"
	"strings"

	"moxie/checkpoint"
	"moxie/compute"
	"moxie/dsv4/config"
)

// DefaultShare is the fraction of MemAvailable used when no budget is given.
const DefaultShare = 0.80

// PlanChunk is the prefill chunk length (tokens) the activation estimate
// assumes; longer prompts must be prefilled in chunks of at most this many.
const PlanChunk = 512

// Plan is how a memory budget is spent: what stays resident (dense weights,
// per-sequence state, scratch) and how many routed experts per layer fit in
// the rest. All sizes are bytes.
type Plan struct {
	Model      string
	Config     *config.Config
	Budget     int64
	BudgetNote string // where the budget came from
	Context    int    // tokens of context the KV state is sized for

	// Dense is every tensor of the main model that is not a routed expert
	// (MTP blocks excluded: their forward is not run), as stored; DenseByRole
	// splits it (indexed by config.Role).
	Dense       int64
	DenseByRole map[config.Role]int64
	// KVFixed (window rings, compressor buffers) and KVPerToken (compressed KV
	// and indexer keys, averaged over the compression ratios) are the
	// per-sequence state in float32, as dsv4.Session stores it today; KV is
	// their total for Context tokens.
	KVFixed    int64
	KVPerToken float64
	KV         int64
	// Activations estimates the forward pass's working buffers for a prefill
	// chunk of PlanChunk tokens.
	Activations int64
	// ExpertScratch is one expert buffer per main layer, for misses the
	// policy serves without installing.
	ExpertScratch int64
	ExpertBytes   int64
	// Slots is each layer's resident-expert capacity (main layers, then MTP
	// blocks, which get 0); ExpertsBytes = their total size.
	Slots        []int
	ExpertsBytes int64
}

// Required is the budget below which the plan is impossible: dense weights,
// state, activations and expert scratch.
func (p *Plan) Required() int64 { return p.Dense + p.KV + p.Activations + p.ExpertScratch }

// Resident is the number of routed experts that fit.
func (p *Plan) Resident() int {
	n := 0
	for _, s := range p.Slots {
		n += s
	}
	return n
}

// Options returns store options for the plan (slots per layer) with the given
// policy; the caller sets Backend.
func (p *Plan) Options(pol PolicyFunc) Options { return Options{Slots: p.Slots, Policy: pol} }

// NewPlan plans budget bytes for the model in src with configuration cfg and
// ctx tokens of context, from tensor headers only. It fails, saying how much
// is needed, when the budget cannot hold the dense part, state and scratch.
func NewPlan(src checkpoint.Source, cfg *config.Config, budget int64, ctx int) (*Plan, error) {
	if ctx < 1 {
		return nil, fmt.Errorf("context %d tokens, want >= 1", ctx)
	}
	if ctx > cfg.MaxPositions {
		return nil, fmt.Errorf("context %d tokens exceeds the model's max_position_embeddings %d", ctx, cfg.MaxPositions)
	}
	p := &Plan{Model: src.Name(), Config: cfg, Budget: budget, Context: ctx, DenseByRole: map[config.Role]int64{},
		ExpertBytes: config.ExpertBytes(cfg)}
	for _, t := range config.Layout(cfg) {
		if t.Role == config.RoleRoutedExpert || t.Role == config.RoleMTP {
			continue
		}
		ti, ok := src.Lookup(t.Name)
		if !ok {
			return nil, fmt.Errorf("%s: tensor %s is missing", src.Name(), t.Name)
		}
		p.Dense += ti.Size
		p.DenseByRole[t.Role] += ti.Size
	}
	p.KVFixed, p.KVPerToken, p.KV = kvState(cfg, ctx)
	p.Activations = activations(cfg, min(ctx, PlanChunk))
	p.ExpertScratch = int64(cfg.NLayers) * p.ExpertBytes
	if need := p.Required(); budget < need {
		return nil, fmt.Errorf("a budget of %s cannot hold the dense part: need at least %s (dense weights %s, KV and compressor state for %d tokens %s, activations %s, expert scratch %s)",
			progress.FormatBytes(budget), progress.FormatBytes(need), progress.FormatBytes(p.Dense), ctx, progress.FormatBytes(p.KV), progress.FormatBytes(p.Activations), progress.FormatBytes(p.ExpertScratch))
	}
	p.Slots = append(SlotsForBudget(budget-p.Required(), p.ExpertBytes, cfg.NLayers, cfg.NRoutedExperts), make([]int, cfg.NMTPLayers)...)
	p.ExpertsBytes = int64(p.Resident()) * p.ExpertBytes
	return p, nil
}

// kvState is the float32 per-sequence state of dsv4.Session for ctx tokens:
// per layer a window ring [Window, HeadDim]; for compressed layers the
// compressor buffers (current window of κ and z [R, c·d], the previous one for
// overlapping CSA, pooling scratch [c·R, d] twice and [d]) and one compressed
// entry [HeadDim] per R tokens; CSA layers add the indexer's compressor
// (d = IndexHeadDim) and one key [IndexHeadDim] per R tokens.
func kvState(c *config.Config, ctx int) (fixed int64, perToken float64, total int64) {
	comp := func(r, dw int) int64 {
		cc := 1
		if r == config.CSARatio {
			cc = 2
		}
		w := int64(cc * dw)
		n := 2 * int64(r) * w
		if cc == 2 {
			n *= 2
		}
		return n + 2*int64(cc*r*dw) + int64(dw)
	}
	var grow int64
	for l := range c.NLayers {
		fixed += int64(c.Window * c.HeadDim)
		r := c.Ratio(l)
		if r == 0 {
			continue
		}
		fixed += comp(r, c.HeadDim)
		w := int64(c.HeadDim)
		if r == config.CSARatio {
			fixed += comp(r, c.IndexHeadDim)
			w += int64(c.IndexHeadDim)
		}
		grow += int64(ctx/r) * w
		perToken += float64(w) / float64(r)
	}
	return 4 * fixed, 4 * perToken, 4 * (fixed + grow)
}

// activations estimates the float32 working buffers of one forward call over
// T tokens: streams and their copies (4·hc·D), attention projections
// (2·H·d + q-LoRA), norms and MoE outputs (4·D), routed-expert SwiGLU inputs
// and outputs (K·(2·I + 2·D)), router logits (E), attention scores over the
// window plus the indexer's top-k (H·(W + topk)), and one row of logits.
func activations(c *config.Config, T int) int64 {
	per := 4*c.HCMult*c.Dim + 2*c.NHeads*c.HeadDim + c.QLoraRank + 4*c.Dim +
		c.NActivatedExperts*(2*c.MoEInterDim+2*c.Dim) + c.NRoutedExperts + c.NHeads*(c.Window+c.IndexTopK)
	return 4 * (int64(T)*int64(per) + int64(c.VocabSize))
}

// ParseMemAvailable reads MemAvailable from the text of /proc/meminfo, in bytes.
func ParseMemAvailable(meminfo []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != "MemAvailable" {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("MemAvailable line %q, want \"MemAvailable: N kB\"", sc.Text())
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || n < 0 || n > 1<<52 {
			return 0, fmt.Errorf("MemAvailable %q is not a kB count", f[0])
		}
		return n << 10, nil
	}
	return 0, fmt.Errorf("no MemAvailable line")
}

// DefaultBudget is DefaultShare of the memory available now (Linux
// /proc/meminfo MemAvailable), with a note saying so.
func DefaultBudget() (int64, string, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, "", fmt.Errorf("no --mem given and the available memory is unknown (%v); pass --mem", err)
	}
	avail, err := ParseMemAvailable(data)
	if err != nil {
		return 0, "", fmt.Errorf("/proc/meminfo: %w; pass --mem", err)
	}
	b := int64(float64(avail) * DefaultShare)
	return b, fmt.Sprintf("%.0f%% of the %s available now (MemAvailable); set --mem to choose", DefaultShare*100, progress.FormatBytes(avail)), nil
}

// NewStore builds the store the plan describes, binding with be (the model's
// backend) and residency policy pol (nil: LRU). Typical use for `--mem`:
//
//	p, err := experts.NewPlan(src, cfg, budget, ctx)
//	st, err := p.NewStore(src, be, nil)
//	m, err := dsv4.Load(src, dsv4.Options{Backend: be, Experts: st})
func (p *Plan) NewStore(src checkpoint.Source, be compute.Backend, pol PolicyFunc) (*Store, error) {
	o := p.Options(pol)
	o.Backend = be
	return New(src, p.Config, o)
}
