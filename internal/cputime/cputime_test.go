package cputime

import (
	"runtime"
	"testing"
)

// Both clocks advance while this goroutine burns CPU (on platforms that have them).
func TestClocksAdvance(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p0, t0 := Process(), Thread()
	x := 0.0
	for i := range 20_000_000 {
		x += float64(i % 7)
	}
	p1, t1 := Process(), Thread()
	if x == 0 {
		t.Fatal("loop optimised away")
	}
	if p0 != 0 && p1 <= p0 {
		t.Errorf("process CPU time did not advance: %v -> %v", p0, p1)
	}
	if t0 != 0 && t1 <= t0 {
		t.Errorf("thread CPU time did not advance: %v -> %v", t0, t1)
	}
	if runtime.GOOS == "linux" && (p0 == 0 || t0 == 0) {
		t.Errorf("Linux must provide both clocks (process %v, thread %v)", p0, t0)
	}
}
