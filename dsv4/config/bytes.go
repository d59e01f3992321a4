package config

import "strings"

// ExpertBytes is the stored size of one routed expert of c: w1, w3 and w2 and
// their scale tensors (every expert has the same size).
func ExpertBytes(c *Config) int64 {
	var n int64
	for _, t := range Layout(c) {
		if t.Role == RoleRoutedExpert && t.Layer == 0 && t.Expert == 0 {
			n += t.Bytes()
		}
	}
	return n
}

// DenseBytesPerToken is the least a decoded token must read at batch 1 in the
// main model (MTP blocks are not run) besides routed experts: every other tensor
// once, except that the embedding gives one row and, on hash-routed layers, the
// router gate and tid2eid give only the rows of the selected experts.
func DenseBytesPerToken(c *Config) int64 {
	var n int64
	for _, t := range Layout(c) {
		switch {
		case t.Layer >= c.NLayers || t.Role == RoleRoutedExpert:
		case t.Name == "embed.weight", strings.HasSuffix(t.Name, "gate.tid2eid"):
			n += t.Bytes() / t.Shape[0]
		case strings.HasSuffix(t.Name, "ffn.gate.weight") && c.HashRouted(t.Layer):
			n += t.Bytes() / t.Shape[0] * int64(c.NActivatedExperts)
		default:
			n += t.Bytes()
		}
	}
	return n
}

// BytesPerToken is the weight bytes one decoded token reads at batch 1: the
// dense part and the selected routed experts of every main layer. It is the
// numerator of the decode roofline.
func BytesPerToken(c *Config) int64 {
	return DenseBytesPerToken(c) + int64(c.NLayers*c.NActivatedExperts)*ExpertBytes(c)
}
