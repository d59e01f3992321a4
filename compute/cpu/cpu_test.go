package cpu

import (
	"testing"

	"moxie/compute/computetest"
)

func TestCompliance(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(New(workers).Name(), func(t *testing.T) { computetest.RunAll(t, New(workers)) })
	}
}
