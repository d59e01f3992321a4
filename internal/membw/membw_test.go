package membw

import "testing"

func TestMeasure(t *testing.T) {
	r := Measure(8<<20, 2, 2)
	if r.Bytes != 8<<20 || r.Workers != 2 || r.Best <= 0 || r.GBps() <= 0 {
		t.Fatalf("implausible result %+v", r)
	}
	if r := Measure(1, 1, 1); r.Bytes != 4<<16 {
		t.Fatalf("a tiny size reads one work item, got %d bytes", r.Bytes)
	}
}
