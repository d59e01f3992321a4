// Package progress draws progress bars for long operations: a redrawn bar on a
// terminal, and a plain line every few seconds when output goes to a log.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// Bar tracks progress toward a known total in some unit (bytes or items).
// Its methods are safe for concurrent use.
type Bar struct {
	mu      sync.Mutex
	w       io.Writer
	tty     bool
	label   string
	total   int64
	cur     int64
	bytes   bool
	start   time.Time
	last    time.Time
	every   time.Duration
	done    bool
	lastLen int
}

// New returns a bar that writes to w; label names the work, total is the amount
// to do, and bytes selects byte units (MB/s, GB) instead of plain counts.
// When w is a terminal the bar redraws in place; otherwise it prints a line at
// most every 5 seconds.
func New(w io.Writer, label string, total int64, bytes bool) *Bar {
	tty := false
	if f, ok := w.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	every := 5 * time.Second
	if tty {
		every = 100 * time.Millisecond
	}
	now := time.Now()
	return &Bar{w: w, tty: tty, label: label, total: total, bytes: bytes, start: now, every: every}
}

// Add records n more units done and redraws if due.
func (b *Bar) Add(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cur += n
	if now := time.Now(); now.Sub(b.last) >= b.every {
		b.last = now
		b.draw(false)
	}
}

// Done draws the final state and ends the line. Calling it twice is harmless.
func (b *Bar) Done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return
	}
	b.done = true
	b.draw(true)
}

func (b *Bar) amount(v int64) string {
	if !b.bytes {
		return fmt.Sprint(v)
	}
	return FormatBytes(v)
}

func (b *Bar) draw(final bool) {
	el := time.Since(b.start).Seconds()
	rate := ""
	if el > 0 {
		r := float64(b.cur) / el
		if b.bytes {
			rate = FormatBytes(int64(r)) + "/s"
		} else {
			rate = fmt.Sprintf("%.1f/s", r)
		}
	}
	frac := 1.0
	if b.total > 0 {
		frac = min(float64(b.cur)/float64(b.total), 1)
	}
	const width = 30
	filled := int(frac * width)
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
	eta := ""
	if !final && frac > 0 && frac < 1 {
		eta = fmt.Sprintf(" eta %s", time.Duration(el*(1-frac)/frac*float64(time.Second)).Round(time.Second))
	}
	line := fmt.Sprintf("%s [%s] %3.0f%% %s/%s %s%s", b.label, bar, frac*100, b.amount(b.cur), b.amount(b.total), rate, eta)
	if b.tty {
		pad := ""
		if n := b.lastLen - len(line); n > 0 {
			pad = strings.Repeat(" ", n)
		}
		b.lastLen = len(line)
		fmt.Fprintf(b.w, "\r%s%s", line, pad)
		if final {
			fmt.Fprintln(b.w)
		}
		return
	}
	fmt.Fprintln(b.w, line)
}

// FormatBytes renders n bytes with a binary-prefixed unit (KiB, MiB, GiB, ...)
// and two decimals, or as plain bytes below 1 KiB; negative counts get a sign.
func FormatBytes(n int64) string {
	sign, v := "", float64(n)
	if n < 0 {
		sign, v = "-", -v
	}
	const unit = 1024
	if v < unit {
		return fmt.Sprintf("%d B", n)
	}
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v /= unit
		if v < unit {
			return fmt.Sprintf("%s%.2f %s", sign, v, u)
		}
	}
	return fmt.Sprintf("%s%.2f PiB", sign, v/unit)
}
