package experts

import (
	"math"
	"strings"
	"testing"

	"moxie/checkpoint"
	"moxie/compute/cpu"
	"moxie/dsv4/config"
)

func flashSource(t *testing.T) (checkpoint.Source, *config.Config) {
	t.Helper()
	src, err := checkpoint.OpenSynth("synth:flash")
	if err != nil {
		t.Fatal(err)
	}
	return src, src.Config()
}

// TestPlanFlash checks the plan against dsv4-flash.md: §4.10 gives 6,880
// B/token of cache growth in BF16, so 13,760 in float32; §8's per-token dense
// traffic (7.766 GB: attention 4.599, CSA 0.628, HCA 0.173, HC 0.135, router
// 0.090, shared 1.082, head 1.059) plus the whole embedding (1.059 GB) and the
// hash tables (3 x 129280 x 6 x 8 B) is the resident dense part.
func TestPlanFlash(t *testing.T) {
	src, cfg := flashSource(t)
	p, err := NewPlan(src, cfg, 24<<30, 32768)
	if err != nil {
		t.Fatal(err)
	}
	if p.KVPerToken != 13760 {
		t.Fatalf("KV growth %g B/token, want 13760", p.KVPerToken)
	}
	// Fixed float32 state, counted from dsv4.Session's buffers: rings 43 x 128 x 512;
	// a CSA compressor (R=4, two 512-wide halves) holds cur, curZ, prev, prevZ
	// [4, 1024] + slots, slotZ [8, 512] + out [512] = 25,088 floats, its
	// indexer compressor (d=128) 6,272; an HCA compressor (R=128) cur, curZ
	// [128, 512] + slots, slotZ [128, 512] + out = 262,656. 21 CSA, 20 HCA layers.
	if want := int64(4 * (43*128*512 + 21*(25088+6272) + 20*262656)); p.KVFixed != want {
		t.Fatalf("fixed state %d B, want %d", p.KVFixed, want)
	}
	// 32768 tokens: CSA entries 21 layers x 8192 x (512+128) x 4, HCA 20 x 256 x 512 x 4.
	if want := p.KVFixed + 21*8192*640*4 + 20*256*512*4; p.KV != want {
		t.Fatalf("KV %d, want %d", p.KV, want)
	}
	wantDense := 7.766e9 + 1.059e9 + 3*129280*6*8
	if math.Abs(float64(p.Dense)-wantDense)/wantDense > 0.005 {
		t.Fatalf("dense %d B, want about %.0f", p.Dense, wantDense)
	}
	eb := int64(13369344) // 2·(2048·2048 + 2048·128) + 4096·1024 + 4096·64
	if p.ExpertBytes != eb {
		t.Fatalf("expert bytes %d, want %d", p.ExpertBytes, eb)
	}
	free := p.Budget - p.Required()
	if n := int64(p.Resident()); n != free/eb {
		t.Fatalf("%d experts resident, want %d (free %d / %d)", n, free/eb, free, eb)
	}
	if len(p.Slots) != 44 || p.Slots[43] != 0 || p.Slots[0] < p.Slots[42] || p.Slots[0]-p.Slots[42] > 1 {
		t.Fatalf("slots %v: want 43 even main layers and 0 for MTP", p.Slots)
	}
	if p.Required()+p.ExpertsBytes > p.Budget {
		t.Fatal("plan exceeds the budget")
	}
}

func TestPlanRefusesImpossibleBudgets(t *testing.T) {
	src, cfg := flashSource(t)
	for _, tc := range []struct {
		name    string
		budget  int64
		ctx     int
		wantErr string
	}{
		{"8GiB", 8 << 30, 4096, "cannot hold the dense part: need at least"},
		{"0", 0, 4096, "need at least"},
		{"ctx", 24 << 30, 0, "context 0"},
		{"ctx max", 24 << 30, 2 << 20, "exceeds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewPlan(src, cfg, tc.budget, tc.ctx)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
	// Exactly the requirement fits with zero experts; one byte less does not.
	p, err := NewPlan(src, cfg, 24<<30, 4096)
	if err != nil {
		t.Fatal(err)
	}
	need := p.Required()
	if q, err := NewPlan(src, cfg, need, 4096); err != nil || q.Resident() != 0 {
		t.Fatalf("budget = requirement: %v, %d resident", err, q.Resident())
	}
	if _, err := NewPlan(src, cfg, need-1, 4096); err == nil {
		t.Fatal("budget one byte short accepted")
	}
}

func TestPlanTinyAllResident(t *testing.T) {
	src, _ := checkpoint.OpenSynth("synth:tiny")
	p, err := NewPlan(src, src.Config(), 1<<30, 256)
	if err != nil {
		t.Fatal(err)
	}
	for l, n := range p.Slots {
		want := 8
		if l >= 4 {
			want = 0
		}
		if n != want {
			t.Fatalf("slots %v, want 8 per main layer, 0 for MTP", p.Slots)
		}
	}
}

func TestParseMemAvailable(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     int64
		wantErr  string
	}{
		{"ok", "MemTotal:       24684092 kB\nMemFree:  1 kB\nMemAvailable:   15878008 kB\n", 15878008 << 10, ""},
		{"missing", "MemTotal: 5 kB\n", 0, "no MemAvailable"},
		{"unit", "MemAvailable: 5 MB\n", 0, "want \"MemAvailable: N kB\""},
		{"number", "MemAvailable: x kB\n", 0, "not a kB count"},
		{"negative", "MemAvailable: -5 kB\n", 0, "not a kB count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseMemAvailable([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("= %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func FuzzParseMemAvailable(f *testing.F) {
	f.Add([]byte("MemTotal: 1 kB\nMemAvailable: 2 kB\n"))
	f.Add([]byte("MemAvailable:\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := ParseMemAvailable(data)
		if err == nil && (n < 0 || n%1024 != 0) {
			t.Fatalf("accepted %d bytes", n)
		}
	})
}

func TestPlanNewStore(t *testing.T) {
	src, _ := checkpoint.OpenSynth("synth:tiny")
	cfg := src.Config()
	// Room for the requirement plus 6 experts: 2 each in layers 0-1, 1 in 2-3.
	p0, err := NewPlan(src, cfg, 1<<30, 64)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPlan(src, cfg, p0.Required()+6*p0.ExpertBytes, 64)
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.NewStore(src, cpu.New(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for l, want := range []int{2, 2, 1, 1, 0} {
		if st.Capacity(l) != want {
			t.Fatalf("layer %d capacity %d, want %d", l, st.Capacity(l), want)
		}
	}
}
