package experts

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDecayCount: uses at steps 0 and H leave 2^-1 + 1 = 1.5 at step H, and
// 1.5/2 = 0.75 one half-life later.
func TestDecayCount(t *testing.T) {
	d := NewDecay(2, DecayParams{HalfLife: 10, Ratio: 1, Margin: 0})
	d.Use(0, 0)
	d.Use(0, 10)
	for _, tc := range []struct {
		t    int64
		want float64
	}{{10, 1.5}, {20, 0.75}, {40, 0.1875}} {
		if got := d.Count(0, tc.t); math.Abs(got-tc.want) > 1e-12 {
			t.Fatalf("count at %d = %g, want %g", tc.t, got, tc.want)
		}
	}
	if got := d.Count(1, 5); got != 0 {
		t.Fatalf("unused expert count %g, want 0", got)
	}
	// Victim: expert 1 (count 0) over 0; candidate with count 1.5 at t=10 vs 0:
	// 1.5 > 1·0 + 0, so it is installed.
	d2 := NewDecay(3, DecayParams{HalfLife: 10, Ratio: 1, Margin: 0})
	d2.Use(0, 0)
	d2.Use(2, 0)
	d2.Use(2, 10)
	if v, ok := d2.Admit(2, 10, false, []int{0, 1}); v != 1 || !ok {
		t.Fatalf("Admit = %d, %v; want victim 1 (never used), install", v, ok)
	}
}

func TestLRUVictim(t *testing.T) {
	l := NewLRU(4)
	for _, e := range []int{2, 0, 3, 1} {
		l.Use(e, 0)
	}
	if v, ok := l.Admit(9, 1, false, []int{1, 3, 0}); v != 0 || !ok {
		t.Fatalf("victim %d, want 0 (used before 3 and 1)", v)
	}
	if _, ok := l.Admit(9, 1, true, nil); !ok {
		t.Fatal("LRU declined a free slot")
	}
}

func TestParsePolicy(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "hot.txt")
	os.WriteFile(good, []byte(FrequencyHeader+"\n0 3 5\n0 1 7\n"), 0o644)
	bad := filepath.Join(dir, "bad.txt")
	os.WriteFile(bad, []byte("nope\n"), 0o644)
	for _, tc := range []struct {
		spec, name, wantErr string
	}{
		{"lru", "lru", ""},
		{"", "lru", ""},
		{"decay", "decay:h=64,ratio=1.25,margin=4", ""},
		{"decay:h=8,margin=0", "decay:h=8,ratio=1.25,margin=0", ""},
		{"static:" + good, "static:" + good, ""},
		{"lru:x", "", "takes no parameters"},
		{"decay:h=0", "", "must be > 0"},
		{"decay:q=1", "", "unknown parameter"},
		{"decay:h=-1", "", "non-negative"},
		{"static", "", "needs a frequency file"},
		{"static:" + bad, "", "line 1"},
		{"static:" + filepath.Join(dir, "missing"), "", "no such file"},
		{"fifo", "", "unknown policy"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			pf, name, err := ParsePolicy(tc.spec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || name != tc.name || pf(0, 8, 2) == nil {
				t.Fatalf("= %q, %v; want %q", name, err, tc.name)
			}
		})
	}
	pf, _, _ := ParsePolicy("static:" + good)
	s := pf(0, 8, 1).(*Static)
	if !s.hot[1] || s.hot[3] {
		t.Fatalf("static hot set with capacity 1 should be {1} (value 7 > 5)")
	}
}

func TestParseFrequencies(t *testing.T) {
	for _, tc := range []struct {
		name, data, wantErr string
	}{
		{"ok", FrequencyHeader + "\n# c\n\n0 1 2.5\r\n3\t4\t0\n", ""},
		{"header", "moxie expert frequencies v2\n", "line 1"},
		{"fields", FrequencyHeader + "\n0 1\n", "line 2 has 2 fields"},
		{"layer", FrequencyHeader + "\n-1 1 1\n", "layer \"-1\""},
		{"expert", FrequencyHeader + "\n0 70000 1\n", "expert \"70000\""},
		{"nan", FrequencyHeader + "\n0 1 NaN\n", "value \"NaN\""},
		{"neg", FrequencyHeader + "\n0 1 -2\n", "value \"-2\""},
		{"dup", FrequencyHeader + "\n0 1 2\n0 1 3\n", "line 3: layer 0 expert 1 listed twice"},
		{"long", FrequencyHeader + "\n0 1 " + strings.Repeat("1", 300) + "\n", "line 2 is"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ParseFrequencies([]byte(tc.data))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if f.Get(0, 1) != 2.5 || f.Get(3, 4) != 0 || f.Get(5, 5) != 0 {
				t.Fatal("values not read back")
			}
		})
	}
}

func FuzzParseFrequencies(f *testing.F) {
	for _, s := range []string{FrequencyHeader + "\n0 1 2\n1 0 0.5\n", FrequencyHeader + "\n", "x", FrequencyHeader + "\n0 1 1e308\n# x\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := ParseFrequencies(data)
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := fr.Write(&buf); err != nil {
			t.Fatal(err)
		}
		again, err := ParseFrequencies(buf.Bytes())
		if err != nil {
			t.Fatalf("written table does not parse: %v\n%s", err, buf.Bytes())
		}
		var buf2 bytes.Buffer
		again.Write(&buf2)
		if !bytes.Equal(buf.Bytes(), buf2.Bytes()) {
			t.Fatalf("write/parse/write not stable")
		}
		for _, l := range fr.Layers() {
			for e, v := range fr.v[l] {
				if again.Get(l, e) != v {
					t.Fatalf("layer %d expert %d: %g became %g", l, e, v, again.Get(l, e))
				}
			}
		}
	})
}
