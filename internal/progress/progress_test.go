package progress

import (
	"bytes"
	"strings"
	"testing"
)

func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{{0, "0 B"}, {1023, "1023 B"}, {1024, "1.00 KiB"}, {3 << 20, "3.00 MiB"}, {159609485896, "148.65 GiB"},
		{-1023, "-1023 B"}, {-3 << 19, "-1.50 MiB"}, {-1 << 63, "-8192.00 PiB"}} {
		if got := FormatBytes(tc.n); got != tc.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestBarNonTTY(t *testing.T) {
	var buf bytes.Buffer
	b := New(&buf, "writing", 200, false)
	b.Add(50)  // first draw is immediate (last is zero)
	b.Add(150) // within 5 s: no draw
	b.Done()
	b.Done()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], " 25% 50/200") || !strings.Contains(lines[1], "100% 200/200") {
		t.Fatalf("unexpected output:\n%s", buf.String())
	}
}
