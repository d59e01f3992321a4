package cpu

import (
	"testing"

	"moxie/compute/computetest"
)

func TestCompliance(t *testing.T) {
	for _, workers := range []int{1, 4} {
		b := New(workers)
		t.Run(b.Name(), func(t *testing.T) { computetest.RunAll(t, b) })
		b.Close()
	}
}
