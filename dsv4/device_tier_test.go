package dsv4

import (
	"fmt"
	"math"
	"moxie/compute/cpu"
	"slices"
	"strconv"
	"strings"
	"testing"

	"moxie/checkpoint"
	"moxie/compute"
	"moxie/compute/cuda"
	"moxie/dsv4/config"
)

func TestPlanTier(t *testing.T) {
	for _, c := range []struct {
		name                  string
		gpu, layers, experts  int
		k                     int
		wantStatic            []int
		wantDynamic           int
		wantStaticAllLayersOf int // when > 0: every layer has this many static (wantStatic unused)
	}{
		{name: "all fit", gpu: 43 * 192, layers: 43, experts: 192, k: 6, wantStaticAllLayersOf: 192},
		{name: "more than all", gpu: 40, layers: 4, experts: 8, k: 2, wantStaticAllLayersOf: 8},
		{name: "only a cache", gpu: 3, layers: 4, experts: 8, k: 2, wantStatic: []int{0, 0, 0, 0}, wantDynamic: 3},
		{name: "4k cache", gpu: 12, layers: 4, experts: 8, k: 2, wantStatic: []int{1, 1, 1, 1}, wantDynamic: 8},
		{name: "uneven static", gpu: 30, layers: 4, experts: 8, k: 2, wantStatic: []int{6, 6, 5, 5}, wantDynamic: 8},
		// 5500 slots: a cache of 5500/16 = 343, 5157 static = 40 layers of 120 + 3 of 119.
		{name: "flash 80GiB-like", gpu: 5500, layers: 43, experts: 192, k: 6,
			wantStatic: append(slices.Repeat([]int{120}, 40), 119, 119, 119), wantDynamic: 343},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := planTier(c.gpu, c.layers, c.experts, c.k)
			want := c.wantStatic
			if c.wantStaticAllLayersOf > 0 {
				want = slices.Repeat([]int{c.wantStaticAllLayersOf}, c.layers)
			}
			if !slices.Equal(p.static, want) || p.dynamic != c.wantDynamic {
				t.Fatalf("planTier(%d, %d, %d, %d) = static %v dynamic %d, want %v and %d", c.gpu, c.layers, c.experts, c.k, p.static, p.dynamic, want, c.wantDynamic)
			}
			if n := c.layers * c.experts; c.gpu < n && p.nStatic()+p.dynamic != c.gpu {
				t.Errorf("%d static + %d cache slots, want all %d GPU slots used", p.nStatic(), p.dynamic, c.gpu)
			}
		})
	}
}

func TestTierPlanHostBytes(t *testing.T) {
	for _, c := range []struct {
		name string
		p    tierPlan
		want int64
	}{
		{"all static", tierPlan{static: []int{8, 8, 8, 8}}, 0},
		{"cache only", tierPlan{static: []int{0, 0, 0, 0}, dynamic: 3}, 32 * 1000},
		{"mixed", tierPlan{static: []int{6, 6, 5, 5}, dynamic: 8}, (2 + 2 + 3 + 3) * 1000},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.p.hostBytes(8, 1000); got != c.want {
				t.Fatalf("hostBytes = %d, want %d", got, c.want)
			}
		})
	}
}

func TestMemAvailable(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		want int64
		ok   bool
	}{
		{"linux", "MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:   120000000 kB\nBuffers: 0 kB\n", 120000000 << 10, true},
		{"last line without newline", "MemTotal: 5 kB\nMemAvailable: 7 kB", 7 << 10, true},
		{"missing", "MemTotal: 5 kB\nMemFree: 3 kB\n", 0, false},
		{"not a number", "MemAvailable: lots kB\n", 0, false},
		{"negative", "MemAvailable: -4 kB\n", 0, false},
		{"empty", "", 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := memAvailable([]byte(c.in))
			if got != c.want || ok != c.ok {
				t.Fatalf("memAvailable = %d, %v; want %d, %v", got, ok, c.want, c.ok)
			}
		})
	}
}

func TestCheckPinnable(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		name       string
		ask, avail int64
		fails      bool
	}{
		{"nothing to pin", 0, 1, false},
		{"unknown host", 200 * gib, -1, false},
		{"fits with the reserve", 40 * gib, 40*gib + HostMemoryReserve, false},
		{"one byte over", 40 * gib, 40*gib + HostMemoryReserve - 1, true},
		{"far over", 100 * gib, 90 * gib, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkPinnable(c.ask, c.avail, 123)
			if (err != nil) != c.fails {
				t.Fatalf("checkPinnable(%d, %d) = %v, want failure %v", c.ask, c.avail, err, c.fails)
			}
			if err != nil {
				for _, s := range []string{strconv.FormatInt(c.ask, 10) + " bytes", "123 routed experts", "--gpu-mem"} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not say %q", err, s)
					}
				}
			}
		})
	}
}

// shapeLie reports a different shape for one tensor.
type shapeLie struct {
	checkpoint.Source
	name string
}

func (s shapeLie) Lookup(name string) (checkpoint.TensorInfo, bool) {
	t, ok := s.Source.Lookup(name)
	if ok && name == s.name {
		t.Shape = append([]int64{t.Shape[0] + 1}, t.Shape[1:]...)
	}
	return t, ok
}

// TestSlotLayout checks the slot image of synth:tiny's experts against the
// tensor list: one piece per stored tensor of an expert, aligned, in the
// order w1, w3, w2 (weight then scale), and weights that bind like the
// model's own binding of any expert.
func TestSlotLayout(t *testing.T) {
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	cfg := src.(interface{ Config() *config.Config }).Config()
	lay, err := newSlotLayout(src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, w := range []string{"w1", "w3", "w2"} {
		for _, k := range []string{"weight", "scale"} {
			if _, ok := src.Lookup(expertPrefix(0, 0) + w + "." + k); ok {
				want = append(want, w+"."+k)
			}
		}
	}
	var got []string
	off := 0
	for _, p := range lay.pieces {
		got = append(got, p.suffix)
		if p.off != off || p.off%arenaAlign != 0 {
			t.Errorf("piece %s at %d, want %d (aligned to %d)", p.suffix, p.off, off, arenaAlign)
		}
		info, _ := src.Lookup(expertPrefix(0, 0) + p.suffix)
		off += (int(info.Size) + arenaAlign - 1) / arenaAlign * arenaAlign
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pieces %v, want %v", got, want)
	}
	if lay.size() != off {
		t.Errorf("slot size %d, want %d", lay.size(), off)
	}
	// The model's binding of another expert has the same formats and shapes.
	b := &binder{src: src, be: recorder{}, cfg: cfg}
	ew := b.expert(expertPrefix(cfg.NLayers-1, cfg.NRoutedExperts-1))
	if err := b.err(); err != nil {
		t.Fatal(err)
	}
	const base = 1 << 20
	x := lay.expertAt(base)
	for i, name := range []string{"w1", "w3", "w2"} {
		d := recorded([]compute.Weight{ew.W1, ew.W3, ew.W2}[i])
		w := []*cuda.DeviceWeight{x.w1, x.w3, x.w2}[i]
		if w.Format != d.Format || w.Rows != d.Rows || w.Cols != d.Cols || w.Block != d.Block || w.Bytes != len(d.Data)+len(d.Scale) {
			t.Errorf("%s: slot weight %v [%d, %d] block %d, %d bytes; the binding has %v [%d, %d] block %d, %d bytes",
				name, w.Format, w.Rows, w.Cols, w.Block, w.Bytes, d.Format, d.Rows, d.Cols, d.Block, len(d.Data)+len(d.Scale))
		}
		dataOff, scaleOff := -1, -1
		for _, p := range lay.pieces {
			switch p.suffix {
			case name + ".weight":
				dataOff = p.off
			case name + ".scale":
				scaleOff = p.off
			}
		}
		if w.Data != cuda.DevicePtr(base+dataOff) {
			t.Errorf("%s data at %#x, want %#x", name, w.Data, base+dataOff)
		}
		if scaleOff >= 0 && w.Scale != cuda.DevicePtr(base+scaleOff) {
			t.Errorf("%s scale at %#x, want %#x", name, w.Scale, base+scaleOff)
		}
	}
	// The order covers every routed expert tensor of the main layers once.
	var all []string
	for _, ti := range src.Tensors() {
		if isRoutedExpert(ti.Name) {
			all = append(all, ti.Name)
		}
	}
	order := tierOrder(lay, cfg)
	if len(order) != len(all) || !slices.Equal(slices.Sorted(slices.Values(order)), all) {
		t.Errorf("tierOrder lists %d names, want the %d routed expert tensors once each", len(order), len(all))
	}
	// A differently shaped expert is refused, by name.
	bad := expertPrefix(2, 5) + "w2.weight"
	if _, err := newSlotLayout(shapeLie{src, bad}, cfg); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("an expert of another shape: error %v, want one naming %s", err, bad)
	}
	if _, err := newSlotLayout(shapeLie{src, expertPrefix(0, 0) + "w2.weight"}, cfg); err == nil {
		t.Errorf("expert 0 of another shape than the rest: no error")
	}
}

// tierBudget is the Options.DeviceMemory under which Load keeps gpu expert
// slots of src on the device (the dense weights, the session reserve and
// the tier's table scratch besides).
func tierBudget(t testing.TB, src checkpoint.Source, cfg *config.Config, gpu int) int64 {
	t.Helper()
	lay, err := newSlotLayout(src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return int64(deviceDenseBytes(src, cfg)) + DeviceReserve + tierMargin + int64(gpu*lay.size())
}

// bitEqual reports the first index where a and b differ bitwise (-1: none).
func bitEqual(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// TestDeviceTierBudget loads synth:tiny under GPU budgets that hold 12, 24
// and 31 of its 32 experts (Load then keeps some static, caches the rest in
// slots and holds them in pinned host memory) and checks that the outputs
// are bit-identical to the all-resident device model's on the same kernel
// path — decode steps (experts chosen on the device) and chunked prefill
// (experts grouped on the host: UseDeviceExperts(false) on the resident
// side) — and within 1e-4 of the CPU; and that the counters add up: every
// decode step uses K experts per layer, and each miss copies one slot image.
func TestDeviceTierBudget(t *testing.T) {
	deviceForTest(t)
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	mc := loadTiny(t, src)
	cfg := mc.Cfg
	V, L, E, K := cfg.VocabSize, cfg.NLayers, cfg.NRoutedExperts, cfg.NActivatedExperts
	toks := testTokens(40, V, 9)
	decode := slices.Repeat([]int{1}, 24)
	chunks := []int{13, 11, 16}
	md0 := loadDeviceModel(t, "synth:tiny", Options{})
	if _, ok := md0.DeviceExpertCache(); ok {
		t.Fatal("the unconstrained model has an expert tier")
	}
	ref := func(sched []int) []float32 {
		s := newDeviceSession(t, md0)
		s.UseGraphs(false)
		s.UseDeviceExperts(false)
		return runSchedule(t, s.PrefillAll, toks, sched)
	}
	wantDecode, wantChunks := ref(decode), ref(chunks)
	cpuDecode := runSchedule(t, mc.NewSession().PrefillAll, toks, decode)
	cpuChunks := runSchedule(t, mc.NewSession().PrefillAll, toks, chunks)
	for _, gpu := range []int{12, 24, 31} {
		t.Run(fmt.Sprint(gpu, " GPU slots"), func(t *testing.T) {
			plan := planTier(gpu, L, E, K)
			md := loadDeviceModel(t, "synth:tiny", Options{DeviceMemory: tierBudget(t, src, cfg, gpu)})
			st, ok := md.DeviceExpertCache()
			if !ok {
				t.Fatal("no expert tier under the budget")
			}
			lay, _ := newSlotLayout(src, cfg)
			if st.Static != plan.nStatic() || st.Slots != plan.dynamic || st.Host != L*E-plan.nStatic() ||
				st.ExpertBytes != lay.size() || st.HostBytes != int64(st.Host)*int64(lay.size()) {
				t.Fatalf("tier %+v, want %d static, %d slots, %d host experts of %d bytes", st, plan.nStatic(), plan.dynamic, L*E-plan.nStatic(), lay.size())
			}
			if n, _, _ := md.DeviceExpertStats(); n != gpu {
				t.Errorf("DeviceExpertStats: %d slots, want %d", n, gpu)
			}
			ds := newDeviceSession(t, md)
			got := runSchedule(t, ds.PrefillAll, toks, decode)
			after := func() DeviceExpertCache { s, _ := md.DeviceExpertCache(); return s }
			d := after().Sub(st)
			if i := bitEqual(got, wantDecode); i >= 0 {
				t.Errorf("decode: logit %d (position %d) is %g, the all-resident model gives %g", i, i/V, got[i], wantDecode[i])
			}
			compareDevice(t, "decode", got, cpuDecode, V, 1e-4)
			if d.Hits+d.Misses != int64(len(decode)*L*K) {
				t.Errorf("decode of %d tokens: %d hits + %d misses, want %d uses (K=%d per layer)", len(decode), d.Hits, d.Misses, len(decode)*L*K, K)
			}
			if d.Misses == 0 || d.PCIeBytes != d.Misses*int64(st.ExpertBytes) {
				t.Errorf("decode: %d misses copied %d bytes, want misses > 0 and %d bytes each", d.Misses, d.PCIeBytes, st.ExpertBytes)
			}
			t.Logf("decode: %s", after())
			ds2 := newDeviceSession(t, md)
			before := after()
			got = runSchedule(t, ds2.PrefillAll, toks, chunks)
			if i := bitEqual(got, wantChunks); i >= 0 {
				t.Errorf("chunks %v: logit %d (position %d) is %g, the all-resident model gives %g", chunks, i, i/V, got[i], wantChunks[i])
			}
			compareDevice(t, "chunks", got, cpuChunks, V, 1e-4)
			if d := after().Sub(before); d.PCIeBytes != d.Misses*int64(st.ExpertBytes) {
				t.Errorf("chunks: %d misses copied %d bytes", d.Misses, d.PCIeBytes)
			}
			t.Logf("after chunks: %s", after())
		})
	}
}

// TestDeviceTierRejects checks the budget errors: fewer GPU slots than the
// experts of one token is refused with the sizes, and an unknown
// MOXIE_DEVICE_EXPERTS by name.
func TestDeviceTierRejects(t *testing.T) {
	dev := deviceForTest(t)
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	cfg := src.(interface{ Config() *config.Config }).Config()
	be := cpu.New(1)
	defer be.Close()
	_, err = Load(src, Options{Backend: be, Device: dev, DeviceMemory: tierBudget(t, src, cfg, cfg.NActivatedExperts-1)})
	if err == nil || !strings.Contains(err.Error(), "even an expert cache") {
		t.Errorf("a budget below %d expert slots: error %v, want one saying what an expert cache needs", cfg.NActivatedExperts, err)
	}
	t.Setenv(DeviceExpertsEnv, "bogus")
	_, err = Load(src, Options{Backend: be, Device: dev, DeviceMemory: tierBudget(t, src, cfg, 12)})
	if err == nil || !strings.Contains(err.Error(), DeviceExpertsEnv) {
		t.Errorf("%s=bogus under a budget: error %v, want one naming the variable", DeviceExpertsEnv, err)
	}
}

// TestDeviceTierMapped loads synth:tiny with MOXIE_DEVICE_EXPERTS=mapped
// under budgets of 2, 12 and 31 GPU expert slots: that many experts stay
// static in GPU memory and the kernels read the rest in place from mapped
// pinned host memory. Sessions then run the resident paths (decode graphs,
// experts grouped on the device for chunks), so the logits must be
// bit-identical to the all-resident model's with the same settings.
func TestDeviceTierMapped(t *testing.T) {
	deviceForTest(t)
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	mc := loadTiny(t, src)
	cfg := mc.Cfg
	V, L, E := cfg.VocabSize, cfg.NLayers, cfg.NRoutedExperts
	toks := testTokens(40, V, 11)
	decode := decodeSchedule(40, 8)
	chunks := []int{13, 11, 16}
	md0 := loadDeviceModel(t, "synth:tiny", Options{})
	ref := func(sched []int) []float32 { return runSchedule(t, newDeviceSession(t, md0).PrefillAll, toks, sched) }
	wantDecode, wantChunks := ref(decode), ref(chunks)
	cpuDecode := runSchedule(t, mc.NewSession().PrefillAll, toks, decode)
	cpuChunks := runSchedule(t, mc.NewSession().PrefillAll, toks, chunks)
	t.Setenv(DeviceExpertsEnv, "mapped")
	for _, gpu := range []int{2, 12, 31} {
		t.Run(fmt.Sprint(gpu, " GPU slots"), func(t *testing.T) {
			md := loadDeviceModel(t, "synth:tiny", Options{DeviceMemory: tierBudget(t, src, cfg, gpu)})
			st, ok := md.DeviceExpertCache()
			if !ok || !st.Mapped || st.Static != gpu || st.Slots != 0 || st.Host != L*E-gpu || st.HostBytes != int64(st.Host)*int64(st.ExpertBytes) {
				t.Fatalf("tier %+v (reported %v), want mapped, %d static, no slots, %d host experts", st, ok, gpu, L*E-gpu)
			}
			ds := newDeviceSession(t, md)
			got := runSchedule(t, ds.PrefillAll, toks, decode)
			if i := bitEqual(got, wantDecode); i >= 0 {
				t.Errorf("decode: logit %d (position %d) is %g, the all-resident model gives %g", i, i/V, got[i], wantDecode[i])
			}
			compareDevice(t, "decode", got, cpuDecode, V, 1e-4)
			t.Logf("%s; %s", ds.Describe(), st)
			got = runSchedule(t, newDeviceSession(t, md).PrefillAll, toks, chunks)
			if i := bitEqual(got, wantChunks); i >= 0 {
				t.Errorf("chunks %v: logit %d (position %d) is %g, the all-resident model gives %g", chunks, i, i/V, got[i], wantChunks[i])
			}
			compareDevice(t, "chunks", got, cpuChunks, V, 1e-4)
		})
	}
}

func TestDeviceExpertMode(t *testing.T) {
	for _, c := range []struct{ env, want string }{{"", "copy"}, {"copy", "copy"}, {"mapped", "mapped"}, {"Mapped", ""}, {"zero-copy", ""}} {
		t.Run(fmt.Sprintf("%q", c.env), func(t *testing.T) {
			t.Setenv(DeviceExpertsEnv, c.env)
			got, err := deviceExpertMode()
			if got != c.want || (err != nil) != (c.want == "") {
				t.Fatalf("mode %q, error %v; want %q", got, err, c.want)
			}
			if err != nil && (!strings.Contains(err.Error(), DeviceExpertsEnv) || !strings.Contains(err.Error(), c.env)) {
				t.Errorf("error %q does not name the variable and its value", err)
			}
		})
	}
}
