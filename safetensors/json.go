package safetensors

import (
	"fmt"
	"math"
	"unicode/utf16"
	"unicode/utf8"
)

// scanner is a strict, allocation-light JSON lexer for the small grammars this
// package reads (safetensors headers, shard indexes). Callers drive it as a
// recursive-descent parser with a fixed structure, so nesting depth is bounded by
// the grammar; generic values are skipped only through skipValue, which takes an
// explicit depth limit. Errors carry the byte position within the JSON text.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) errf(format string, a ...any) error {
	return fmt.Errorf("at JSON byte %d: %s", s.i, fmt.Sprintf(format, a...))
}

// found describes the byte at the current position for error messages.
func (s *scanner) found() string {
	if s.i >= len(s.b) {
		return "end of JSON"
	}
	c := s.b[s.i]
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("%q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

// peek skips whitespace and returns the next byte, or 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

// consume skips whitespace and consumes c; what names c in the error.
func (s *scanner) consume(c byte, what string) error {
	if s.peek() == c && s.i < len(s.b) {
		s.i++
		return nil
	}
	return s.errf("expected %s, found %s", what, s.found())
}

// object parses a JSON object, calling fn for each member with the scanner
// positioned at the member's value; fn must consume the value. The key is the
// decoded key; it may alias the input and is valid only during the call.
func (s *scanner) object(what string, fn func(key []byte) error) error {
	if s.peek() != '{' || s.i >= len(s.b) {
		return s.errf("expected '{' starting %s, found %s", what, s.found())
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		if s.peek() != '"' {
			return s.errf("expected '\"' starting a key in %s, found %s", what, s.found())
		}
		k, err := s.strBytes()
		if err != nil {
			return err
		}
		if err := s.consume(':', "':' after key"); err != nil {
			return err
		}
		if err := fn(k); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return s.errf("expected ',' or '}' in %s, found %s", what, s.found())
		}
	}
}

// str parses a JSON string. Invalid UTF-8, raw control characters, bad escapes
// and unpaired surrogate escapes are errors.
func (s *scanner) str() (string, error) {
	b, err := s.strBytes()
	return string(b), err
}

// strBytes is str returning the decoded bytes, which alias the input when the
// string has no escapes.
func (s *scanner) strBytes() ([]byte, error) {
	if err := s.consume('"', "a string"); err != nil {
		return nil, err
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			v := s.b[start:s.i:s.i]
			s.i++
			return v, nil
		case c == '\\' || c >= 0x80:
			return s.strSlow(start)
		case c < 0x20:
			return nil, s.errf("control character 0x%02x in string (must be escaped)", c)
		}
		s.i++
	}
	return nil, s.errf("unterminated string starting at JSON byte %d", start-1)
}

func (s *scanner) strSlow(start int) ([]byte, error) {
	buf := make([]byte, 0, s.i-start+16)
	buf = append(buf, s.b[start:s.i]...)
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return buf, nil
		case c < 0x20:
			return nil, s.errf("control character 0x%02x in string (must be escaped)", c)
		case c >= 0x80:
			r, n := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && n == 1 {
				return nil, s.errf("invalid UTF-8 in string")
			}
			buf = append(buf, s.b[s.i:s.i+n]...)
			s.i += n
		case c != '\\':
			buf = append(buf, c)
			s.i++
		default:
			if s.i+1 >= len(s.b) {
				return nil, s.errf("unterminated escape in string")
			}
			e := s.b[s.i+1]
			switch e {
			case '"', '\\', '/':
				buf = append(buf, e)
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			case 'u':
				s.i += 2
				r, err := s.hex4()
				if err != nil {
					return nil, err
				}
				if utf16.IsSurrogate(r) {
					if r >= 0xDC00 {
						return nil, s.errf("unpaired low surrogate \\u%04X in string", r)
					}
					if s.i+1 >= len(s.b) || s.b[s.i] != '\\' || s.b[s.i+1] != 'u' {
						return nil, s.errf("unpaired high surrogate \\u%04X in string", r)
					}
					s.i += 2
					r2, err := s.hex4()
					if err != nil {
						return nil, err
					}
					if r2 < 0xDC00 || r2 > 0xDFFF {
						return nil, s.errf("high surrogate \\u%04X followed by \\u%04X, want a low surrogate", r, r2)
					}
					r = utf16.DecodeRune(r, r2)
				}
				buf = utf8.AppendRune(buf, r)
				continue
			default:
				return nil, s.errf("invalid escape \\%c in string", e)
			}
			s.i += 2
		}
	}
	return nil, s.errf("unterminated string starting at JSON byte %d", start-1)
}

func (s *scanner) hex4() (rune, error) {
	if s.i+4 > len(s.b) {
		return 0, s.errf("truncated \\u escape")
	}
	var r rune
	for _, c := range s.b[s.i : s.i+4] {
		r <<= 4
		switch {
		case '0' <= c && c <= '9':
			r |= rune(c - '0')
		case 'a' <= c && c <= 'f':
			r |= rune(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, s.errf("invalid hex digit in \\u escape")
		}
	}
	s.i += 4
	return r, nil
}

// uint parses a non-negative JSON integer that fits in int64. Negative numbers,
// fractions, exponents, leading zeros and overflow are errors.
func (s *scanner) uint() (int64, error) {
	s.ws()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		return 0, s.errf("expected a non-negative integer, found a negative number")
	}
	var v int64
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		if s.i > start && s.b[start] == '0' {
			return 0, s.errf("integer with a leading zero is not valid JSON")
		}
		d := int64(s.b[s.i] - '0')
		if v > (math.MaxInt64-d)/10 {
			return 0, s.errf("integer does not fit in int64 (max %d)", int64(math.MaxInt64))
		}
		v = v*10 + d
		s.i++
	}
	if s.i == start {
		return 0, s.errf("expected a non-negative integer, found %s", s.found())
	}
	if s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return 0, s.errf("expected an integer, found a fraction or exponent")
	}
	return v, nil
}

// uintArray parses an array of at most max non-negative integers, appending
// them to dst.
func (s *scanner) uintArray(dst []int64, max int) ([]int64, error) {
	if err := s.consume('[', "'[' starting an array of integers"); err != nil {
		return dst, err
	}
	if s.peek() == ']' {
		s.i++
		return dst, nil
	}
	for n := 0; ; n++ {
		if n == max {
			return dst, s.errf("array has more than %d entries", max)
		}
		v, err := s.uint()
		if err != nil {
			return dst, err
		}
		dst = append(dst, v)
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return dst, nil
		default:
			return dst, s.errf("expected ',' or ']' in array, found %s", s.found())
		}
	}
}

// literal consumes the exact keyword lit (true, false, null).
func (s *scanner) literal(lit string) error {
	s.ws()
	if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return nil
	}
	return s.errf("expected %s, found %s", lit, s.found())
}

// number consumes any JSON number.
func (s *scanner) number() error {
	s.ws()
	digits := func() int {
		n := 0
		for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	start := s.i
	n := digits()
	if n == 0 {
		return s.errf("expected a JSON value, found %s", s.found())
	}
	if n > 1 && s.b[start] == '0' {
		return s.errf("number with a leading zero is not valid JSON")
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return s.errf("expected digits after '.', found %s", s.found())
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return s.errf("expected exponent digits, found %s", s.found())
		}
	}
	return nil
}

// skipValue consumes any JSON value whose nesting, counting the value itself as
// level depth, does not exceed maxDepth.
func (s *scanner) skipValue(depth, maxDepth int) error {
	c := s.peek()
	if (c == '{' || c == '[') && depth > maxDepth {
		return s.errf("JSON nested deeper than %d levels", maxDepth)
	}
	switch c {
	case '"':
		_, err := s.str()
		return err
	case '{':
		return s.object("an object", func([]byte) error { return s.skipValue(depth+1, maxDepth) })
	case '[':
		s.i++
		if s.peek() == ']' {
			s.i++
			return nil
		}
		for {
			if err := s.skipValue(depth+1, maxDepth); err != nil {
				return err
			}
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return nil
			default:
				return s.errf("expected ',' or ']' in array, found %s", s.found())
			}
		}
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		return s.number()
	}
}

// end checks that only whitespace remains.
func (s *scanner) end() error {
	if s.peek() != 0 || s.i < len(s.b) {
		return s.errf("unexpected %s after the top-level object", s.found())
	}
	return nil
}

// appendString appends s as a JSON string. s must be valid UTF-8.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\t':
			b = append(b, '\\', 't')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
