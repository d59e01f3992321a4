package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
)

// TestParseBytes checks sizes against their definitions (powers of two for
// the IEC units, of ten for the SI ones) and the inputs that must fail
// with an error instead of a wrong size.
func TestParseBytes(t *testing.T) {
	cases := []struct {
		in   string
		want int64 // 0: an error
	}{
		{"1024", 1024},
		{"1B", 1},
		{"16MiB", 16 << 20},
		{"80GiB", 80 << 30},
		{"80gib", 80 << 30},
		{"80 GiB", 80 << 30},
		{" 4GIB ", 4 << 30},
		{"1.5TiB", 3 << 39},
		{"500MB", 500_000_000},
		{"500mb", 500_000_000},
		{"2KiB", 2048},
		{"2kb", 2000},
		{"1e3MB", 1_000_000_000},
		{"1.9B", 1}, // rounded down to whole bytes
		{"4EiB", 0}, // not a unit: "4Ei" is not a number
		{"4096TiB", 1 << 52},
		{"4097TiB", 1<<52 + 1<<40},
		{"4194304TiB", 1 << 62},
		{"4194305TiB", 0}, // past 2^62
		{"12GiBs", 0},
		{"4x", 0},
		{"GiB", 0},
		{"", 0},
		{"0", 0},
		{"0.4B", 0},
		{"-1GiB", 0},
		{"NaN", 0},
		{"Inf", 0},
		{"0x10", 0},
		{"0x1p4", 0},
		{"1_000", 0},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := parseBytes(c.in)
			switch {
			case c.want == 0 && err == nil:
				t.Errorf("parseBytes(%q) = %d, want an error", c.in, got)
			case c.want != 0 && err != nil:
				t.Errorf("parseBytes(%q): %v, want %d", c.in, err, c.want)
			case got != c.want:
				t.Errorf("parseBytes(%q) = %d, want %d", c.in, got, c.want)
			}
			if err != nil && !strings.Contains(err.Error(), strconv.Quote(c.in)) {
				t.Errorf("parseBytes(%q): error %q does not name the input", c.in, err)
			}
		})
	}
}

// FuzzParseBytes: any input gives an error or a size in [1, 2^62]; a size
// printed back as a byte count parses to itself; and an accepted input is
// a decimal number and a unit, whose value agrees with strconv's reading
// of the number times the unit.
func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"80GiB", "1.5 TB", "500mb", "1024", "12GiBs", "NaN", "0x1p4", "-3KB", " 7 kib "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseBytes(s)
		if err != nil {
			return
		}
		if n < 1 || n > 1<<62 {
			t.Fatalf("parseBytes(%q) = %d, outside [1, 2^62]", s, n)
		}
		if m, err := parseBytes(fmt.Sprint(n)); err != nil || m != n {
			t.Fatalf("parseBytes(%q) = %d, but %d parses to %d (%v)", s, n, n, m, err)
		}
		num, mul := strings.TrimSpace(s), 1.0
		for _, u := range []struct {
			suf string
			mul float64
		}{{"tib", 1 << 40}, {"gib", 1 << 30}, {"mib", 1 << 20}, {"kib", 1 << 10}, {"tb", 1e12}, {"gb", 1e9}, {"mb", 1e6}, {"kb", 1e3}, {"b", 1}} {
			if strings.HasSuffix(strings.ToLower(num), u.suf) {
				num, mul = strings.TrimSpace(num[:len(num)-len(u.suf)]), u.mul
				break
			}
		}
		v, perr := strconv.ParseFloat(num, 64)
		if perr != nil {
			t.Fatalf("parseBytes(%q) = %d, but %q is not a number", s, n, num)
		}
		if want := math.Floor(v * mul); float64(n) != want {
			t.Fatalf("parseBytes(%q) = %d, want %.0f", s, n, want)
		}
	})
}
