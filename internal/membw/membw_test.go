package membw

import "testing"

func TestSum(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 100} {
		a := make([]uint64, n)
		var want uint64
		for i := range a {
			a[i] = uint64(i*i + 1)
			want += a[i]
		}
		if got := sum(a); got != want {
			t.Errorf("sum of %d = %d, want %d", n, got, want)
		}
	}
}

func TestMeasure(t *testing.T) {
	r := Measure(8<<20, 2, 2)
	if r.Bytes <= 0 || r.Bytes > 8<<20 || r.Workers != 2 || r.Best <= 0 || r.GBps() <= 0 {
		t.Fatalf("implausible result %+v", r)
	}
}
