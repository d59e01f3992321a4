package kern

// readSumScalar adds a with eight independent accumulators.
func readSumScalar(a []float32) float32 {
	var s [8]float32
	i := 0
	for ; i+8 <= len(a); i += 8 {
		aa := (*[8]float32)(a[i : i+8])
		s[0] += aa[0]
		s[1] += aa[1]
		s[2] += aa[2]
		s[3] += aa[3]
		s[4] += aa[4]
		s[5] += aa[5]
		s[6] += aa[6]
		s[7] += aa[7]
	}
	for ; i < len(a); i++ {
		s[0] += a[i]
	}
	return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7]
}
