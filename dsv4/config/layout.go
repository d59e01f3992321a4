package config

import (
	"fmt"

	"moxie/format"
)

// Role groups tensors by what they do, for inspection and planning.
type Role int

const (
	RoleEmbedHead    Role = iota // embed, head, final norm, hc_head
	RoleAttention                // attention core: norms, wq_a, wq_b, wkv, wo_a, wo_b, sinks
	RoleCompressor               // compressors and the lightning indexer
	RoleHC                       // hyper-connection mixers
	RoleRouter                   // ffn_norm, gate weight, bias, tid2eid
	RoleSharedExpert             // shared expert
	RoleRoutedExpert             // routed experts
	RoleMTP                      // everything under mtp.*
	numRoles
)

// Roles lists every role in display order.
func Roles() []Role {
	r := make([]Role, numRoles)
	for i := range r {
		r[i] = Role(i)
	}
	return r
}

func (r Role) String() string {
	switch r {
	case RoleEmbedHead:
		return "embedding and head"
	case RoleAttention:
		return "attention"
	case RoleCompressor:
		return "compressor and indexer"
	case RoleHC:
		return "hyper-connections"
	case RoleRouter:
		return "router"
	case RoleSharedExpert:
		return "shared expert"
	case RoleRoutedExpert:
		return "routed experts"
	case RoleMTP:
		return "MTP"
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// Tensor is one entry of a checkpoint layout.
type Tensor struct {
	Name  string
	DType format.DType
	Shape []int64
	Role  Role
	// Layer is the block index (main layers 0..NLayers-1, MTP layers NLayers..),
	// or -1 for global tensors.
	Layer int
	// Expert is the routed expert index, or -1.
	Expert int
	// ScaleOf names the weight this tensor scales ("" if it is not a scale).
	ScaleOf string
}

// Bytes is the stored size of t.
func (t Tensor) Bytes() int64 {
	n := int64(t.DType.Size())
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

func ceilDiv(a, b int) int64 { return int64((a + b - 1) / b) }

type layoutBuilder struct {
	c   *Config
	out []Tensor
}

func (b *layoutBuilder) add(name string, dt format.DType, role Role, layer, expert int, shape ...int) {
	s := make([]int64, len(shape))
	for i, d := range shape {
		s[i] = int64(d)
	}
	b.out = append(b.out, Tensor{Name: name, DType: dt, Shape: s, Role: role, Layer: layer, Expert: expert})
}

// fp8 adds an FP8 E4M3 weight [out, in] and its E8M0 block-scale tensor.
func (b *layoutBuilder) fp8(prefix string, role Role, layer, expert, out, in int) {
	bs := b.c.BlockSize
	b.add(prefix+".weight", format.F8E4M3, role, layer, expert, out, in)
	shape := []int64{ceilDiv(out, bs), ceilDiv(in, bs)}
	if b.c.DenseFormat == "mxfp8" {
		shape = []int64{int64(out), ceilDiv(in, 32)}
	}
	b.out = append(b.out, Tensor{Name: prefix + ".scale", DType: format.F8E8M0,
		Shape: shape, Role: role, Layer: layer, Expert: expert,
		ScaleOf: prefix + ".weight"})
}

// expert adds a routed expert projection in the configured expert format.
func (b *layoutBuilder) expert(prefix string, role Role, layer, expert, out, in int) {
	if b.c.ExpertDType == "fp8" {
		b.fp8(prefix, role, layer, expert, out, in)
		return
	}
	b.add(prefix+".weight", format.I8, role, layer, expert, out, in/2)
	b.out = append(b.out, Tensor{Name: prefix + ".scale", DType: format.F8E8M0,
		Shape: []int64{int64(out), int64(in / 32)}, Role: role, Layer: layer, Expert: expert,
		ScaleOf: prefix + ".weight"})
}

// compressor adds a compressor of output width dw at ratio r under prefix.
func (b *layoutBuilder) compressor(prefix string, role Role, layer, r, dw int) {
	c := 1
	if r == CSARatio {
		c = 2
	}
	b.add(prefix+".wkv.weight", format.BF16, role, layer, -1, c*dw, b.c.Dim)
	b.add(prefix+".wgate.weight", format.BF16, role, layer, -1, c*dw, b.c.Dim)
	b.add(prefix+".ape", format.F32, role, layer, -1, r, c*dw)
	b.add(prefix+".norm.weight", format.BF16, role, layer, -1, dw)
}

// block adds the tensors of one decoder block (layer index i) under prefix p,
// with role override for MTP blocks.
func (b *layoutBuilder) block(p string, i int, mtp bool) {
	c := b.c
	role := func(r Role) Role {
		if mtp {
			return RoleMTP
		}
		return r
	}
	D, hcd := c.Dim, c.HCDim()
	b.add(p+"attn_norm.weight", format.BF16, role(RoleAttention), i, -1, D)
	b.add(p+"ffn_norm.weight", format.BF16, role(RoleRouter), i, -1, D)
	for _, s := range []string{"attn", "ffn"} {
		b.add(p+"hc_"+s+"_fn", format.F32, role(RoleHC), i, -1, hcd, c.HCMult*D)
		b.add(p+"hc_"+s+"_base", format.F32, role(RoleHC), i, -1, hcd)
		b.add(p+"hc_"+s+"_scale", format.F32, role(RoleHC), i, -1, 3)
	}
	a := p + "attn."
	ra := role(RoleAttention)
	b.add(a+"attn_sink", format.F32, ra, i, -1, c.NHeads)
	b.fp8(a+"wq_a", ra, i, -1, c.QLoraRank, D)
	b.add(a+"q_norm.weight", format.BF16, ra, i, -1, c.QLoraRank)
	b.fp8(a+"wq_b", ra, i, -1, c.NHeads*c.HeadDim, c.QLoraRank)
	b.fp8(a+"wkv", ra, i, -1, c.HeadDim, D)
	b.add(a+"kv_norm.weight", format.BF16, ra, i, -1, c.HeadDim)
	b.fp8(a+"wo_a", ra, i, -1, c.OGroups*c.OLoraRank, c.NHeads*c.HeadDim/c.OGroups)
	b.fp8(a+"wo_b", ra, i, -1, D, c.OGroups*c.OLoraRank)
	rc := role(RoleCompressor)
	switch r := c.Ratio(i); c.Kind(i) {
	case CSA:
		b.compressor(a+"compressor", rc, i, r, c.HeadDim)
		b.fp8(a+"indexer.wq_b", rc, i, -1, c.IndexNHeads*c.IndexHeadDim, c.QLoraRank)
		b.add(a+"indexer.weights_proj.weight", format.BF16, rc, i, -1, c.IndexNHeads, D)
		b.compressor(a+"indexer.compressor", rc, i, r, c.IndexHeadDim)
	case HCA:
		b.compressor(a+"compressor", rc, i, r, c.HeadDim)
	}
	f := p + "ffn."
	rr := role(RoleRouter)
	b.add(f+"gate.weight", format.BF16, rr, i, -1, c.NRoutedExperts, D)
	if c.HashRouted(i) {
		b.add(f+"gate.tid2eid", format.I64, rr, i, -1, c.VocabSize, c.NActivatedExperts)
	} else {
		b.add(f+"gate.bias", format.F32, rr, i, -1, c.NRoutedExperts)
	}
	re := role(RoleRoutedExpert)
	for e := range c.NRoutedExperts {
		ep := fmt.Sprintf("%sexperts.%d.", f, e)
		b.expert(ep+"w1", re, i, e, c.MoEInterDim, D)
		b.expert(ep+"w3", re, i, e, c.MoEInterDim, D)
		b.expert(ep+"w2", re, i, e, D, c.MoEInterDim)
	}
	if c.NSharedExperts > 0 {
		rs := role(RoleSharedExpert)
		inter := c.MoEInterDim * c.NSharedExperts
		b.fp8(f+"shared_experts.w1", rs, i, -1, inter, D)
		b.fp8(f+"shared_experts.w3", rs, i, -1, inter, D)
		b.fp8(f+"shared_experts.w2", rs, i, -1, D, inter)
	}
}

// Layout lists every tensor of a checkpoint with configuration c, in a stable
// order: global tensors, then layers 0..NLayers-1, then the MTP blocks.
func Layout(c *Config) []Tensor {
	b := &layoutBuilder{c: c}
	D := c.Dim
	b.add("embed.weight", format.BF16, RoleEmbedHead, -1, -1, c.VocabSize, D)
	b.add("head.weight", format.BF16, RoleEmbedHead, -1, -1, c.VocabSize, D)
	b.add("norm.weight", format.BF16, RoleEmbedHead, -1, -1, D)
	b.add("hc_head_fn", format.F32, RoleEmbedHead, -1, -1, c.HCMult, c.HCMult*D)
	b.add("hc_head_base", format.F32, RoleEmbedHead, -1, -1, c.HCMult)
	b.add("hc_head_scale", format.F32, RoleEmbedHead, -1, -1, 1)
	for i := range c.NLayers {
		b.block(fmt.Sprintf("layers.%d.", i), i, false)
	}
	for m := range c.NMTPLayers {
		i := c.NLayers + m
		p := fmt.Sprintf("mtp.%d.", m)
		b.block(p, i, true)
		b.fp8(p+"e_proj", RoleMTP, i, -1, D, D)
		b.fp8(p+"h_proj", RoleMTP, i, -1, D, D)
		b.add(p+"enorm.weight", format.BF16, RoleMTP, i, -1, D)
		b.add(p+"hnorm.weight", format.BF16, RoleMTP, i, -1, D)
		b.add(p+"norm.weight", format.BF16, RoleMTP, i, -1, D)
		b.add(p+"hc_head_fn", format.F32, RoleMTP, i, -1, c.HCMult, c.HCMult*D)
		b.add(p+"hc_head_base", format.F32, RoleMTP, i, -1, c.HCMult)
		b.add(p+"hc_head_scale", format.F32, RoleMTP, i, -1, 1)
	}
	return b.out
}
