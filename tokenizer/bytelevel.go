package tokenizer

// byteLevelAlphabet returns GPT-2's bytes_to_unicode table: the printable
// rune that stands for each byte in a byte-level BPE vocabulary, and its
// inverse. Bytes that are printable Latin-1 map to themselves; the other 68
// bytes map to U+0100 upward in byte order.
func byteLevelAlphabet() (enc [256]rune, dec map[rune]byte) {
	dec = make(map[rune]byte, 256)
	printable := func(b int) bool {
		return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
	}
	n := 0
	for b := 0; b < 256; b++ {
		if printable(b) {
			enc[b] = rune(b)
		} else {
			enc[b] = rune(256 + n)
			n++
		}
		dec[enc[b]] = byte(b)
	}
	return enc, dec
}

// byteLevelDecode converts a vocabulary string written in the byte-level
// alphabet back to the raw bytes it stands for. ok is false when s holds a
// rune outside the alphabet (such entries can never be produced by byte-level
// BPE and are only reachable as added tokens).
func byteLevelDecode(s string, dec map[rune]byte) (b string, ok bool) {
	buf := make([]byte, 0, len(s))
	for _, r := range s {
		c, in := dec[r]
		if !in {
			return "", false
		}
		buf = append(buf, c)
	}
	return string(buf), true
}
