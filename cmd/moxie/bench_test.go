package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moxie/dsv4"
)

// readBenchReport reads a --json report.
func readBenchReport(t *testing.T, path string) benchReport {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r benchReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestBenchWritesConsistentReport(t *testing.T) {
	out := filepath.Join(t.TempDir(), "bench.json")
	code, _, errs := moxie(t, "bench", "synth:tiny", "--prompt", "9", "--decode", "3", "--runs", "1", "--warmup", "1", "--bw-size", "16MiB", "--json", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	r := readBenchReport(t, out)
	if !r.Synthetic || r.PromptTokens != 9 || r.DecodeTokens != 3 || r.WarmupRuns != 1 || r.PrefillTokPerS <= 0 || r.DecodeTokPerS <= 0 || r.MemReadGBps <= 0 {
		t.Fatalf("implausible report %+v", r)
	}
	// The derived figures must follow from the measured ones.
	bound := r.MemReadGBps * 1e9 / float64(r.BytesPerToken)
	if d := r.DecodeBoundTokS/bound - 1; d > 1e-9 || d < -1e-9 {
		t.Fatalf("bound %g, want %g", r.DecodeBoundTokS, bound)
	}
	if d := r.Efficiency/(r.DecodeTokPerS/bound) - 1; d > 1e-9 || d < -1e-9 {
		t.Fatalf("efficiency %g inconsistent", r.Efficiency)
	}
	if r.ExpertHitRate != nil || r.PCIeBytesPerToken != nil || r.DeviceExpertSlots != 0 {
		t.Fatalf("the CPU backend reported device expert figures: %+v", r)
	}
	if code, _, _ := moxie(t, "bench", "--runs", "0"); code != 2 {
		t.Fatalf("--runs 0: exit %d, want 2", code)
	}
	if code, _, _ := moxie(t, "bench", "--warmup", "-1"); code != 2 {
		t.Fatalf("--warmup -1: exit %d, want 2", code)
	}
}

func TestBenchSample(t *testing.T) {
	// --sample times the sampler inside each step and says so in the text
	// and the JSON; without it the report has no sampling.
	for _, sampled := range []bool{false, true} {
		out := filepath.Join(t.TempDir(), "bench.json")
		args := []string{"bench", "synth:tiny", "--prompt", "5", "--decode", "4", "--runs", "1", "--warmup", "0", "--bw-size", "16MiB", "--json", out}
		if sampled {
			args = append(args, "--sample")
		}
		code, stdout, errs := moxie(t, args...)
		if code != 0 {
			t.Fatalf("--sample=%v: exit %d: %s", sampled, code, errs)
		}
		r := readBenchReport(t, out)
		want := ""
		if sampled {
			want = "temperature 0.6, top-p 0.95, on the host" // the CPU backend has no reducer
		}
		if r.Sampling != want || strings.Contains(stdout, "sampling included") != sampled || r.DecodeTokPerS <= 0 {
			t.Errorf("--sample=%v: report sampling %q, text %q", sampled, r.Sampling, stdout)
		}
	}
}

// TestBenchExpertServing checks the expert figures of a device run against
// hand-computed values: hit rates and PCIe bytes per token of the decode
// steps and prefills, the tier's sizes, the JSON keys and the text lines.
func TestBenchExpertServing(t *testing.T) {
	tier := dsv4.DeviceExpertCache{Static: 5157, Slots: 343, Host: 3099, HostBytes: 3099 * 13369344, ExpertBytes: 13369344}
	for _, c := range []struct {
		name             string
		tiered           bool
		dec, pre         dsv4.DeviceExpertCache
		decToks, preToks int
		wantHit, wantPre float64 // hit rates
		wantB, wantPreB  float64 // PCIe bytes per token
		wantKeys         []string
		wantText         []string
	}{
		{name: "all resident", wantHit: 1, wantPre: 1,
			wantKeys: []string{`"expert_hit_rate":1`, `"pcie_bytes_per_token":0`},
			wantText: []string{"all resident on the GPU"}},
		{name: "tier", tiered: true,
			// 48 decode steps × 43 layers × 6 experts = 12,384 uses, 3,096 misses.
			dec:     dsv4.DeviceExpertCache{Hits: 9288, Misses: 3096, PCIeBytes: 3096 * 13369344},
			pre:     dsv4.DeviceExpertCache{Hits: 100, Misses: 300, PCIeBytes: 300 * 13369344},
			decToks: 48, preToks: 192,
			wantHit: 0.75, wantPre: 0.25, wantB: 3096 * 13369344 / 48.0, wantPreB: 300 * 13369344 / 192.0,
			wantKeys: []string{`"expert_hit_rate":0.75`, `"pcie_bytes_per_token":862322688`, `"device_static_experts":5157`, `"device_cache_slots":343`, `"host_experts":3099`, `"device_expert_slots":5500`},
			wantText: []string{"5157 static + 343 cache slots", "3099 experts in pinned host memory", "decode 75.0%", "prefill 25.0%"}},
		{name: "tier, no decode misses", tiered: true,
			dec: dsv4.DeviceExpertCache{Hits: 60}, decToks: 10, preToks: 5,
			wantHit: 1, wantPre: 0, wantB: 0, wantPreB: 0,
			wantKeys: []string{`"expert_hit_rate":1`, `"pcie_bytes_per_token":0`, `"prefill_expert_hit_rate":0`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var rep benchReport
			rep.expertServing(tier, c.tiered, c.dec, c.pre, c.decToks, c.preToks)
			if rep.ExpertsMapped {
				t.Fatalf("a copy-mode tier reported as mapped")
			}
			if rep.ExpertHitRate == nil || rep.PCIeBytesPerToken == nil || rep.PrefillExpertHitRate == nil || rep.PrefillPCIeBytesPerToken == nil {
				t.Fatalf("missing figures: %+v", rep)
			}
			if *rep.ExpertHitRate != c.wantHit || *rep.PrefillExpertHitRate != c.wantPre || *rep.PCIeBytesPerToken != c.wantB || *rep.PrefillPCIeBytesPerToken != c.wantPreB {
				t.Errorf("hit rates %g, %g and bytes/token %g, %g; want %g, %g and %g, %g", *rep.ExpertHitRate, *rep.PrefillExpertHitRate,
					*rep.PCIeBytesPerToken, *rep.PrefillPCIeBytesPerToken, c.wantHit, c.wantPre, c.wantB, c.wantPreB)
			}
			b, err := json.Marshal(&rep)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range c.wantKeys {
				if !strings.Contains(string(b), k) {
					t.Errorf("JSON %s lacks %s", b, k)
				}
			}
			if !c.tiered && strings.Contains(string(b), "device_expert_slots") {
				t.Errorf("all-resident JSON %s names expert slots", b)
			}
			var w strings.Builder
			rep.writeExperts(&w)
			for _, s := range c.wantText {
				if !strings.Contains(w.String(), s) {
					t.Errorf("text %q lacks %q", w.String(), s)
				}
			}
		})
	}
	t.Run("mapped", func(t *testing.T) {
		var rep benchReport
		m := dsv4.DeviceExpertCache{Static: 5443, Host: 2813, HostBytes: 2813 * 13369344, ExpertBytes: 13369344, Mapped: true}
		rep.expertServing(m, true, dsv4.DeviceExpertCache{}, dsv4.DeviceExpertCache{}, 10, 10)
		if !rep.ExpertsMapped || rep.ExpertHitRate != nil || rep.PCIeBytesPerToken != nil || rep.DeviceStaticExperts != 5443 || rep.HostExperts != 2813 || rep.DeviceCacheSlots != 0 {
			t.Fatalf("mapped report %+v: want mapped, 5443 static, 2813 host, no counted figures", rep)
		}
		b, _ := json.Marshal(&rep)
		if !strings.Contains(string(b), `"experts_mapped":true`) || strings.Contains(string(b), "expert_hit_rate") {
			t.Errorf("mapped JSON %s", b)
		}
		var w strings.Builder
		rep.writeExperts(&w)
		if !strings.Contains(w.String(), "5443 static") || !strings.Contains(w.String(), "2813 experts read in place") {
			t.Errorf("mapped text %q", w.String())
		}
	})
	var w strings.Builder
	(&benchReport{}).writeExperts(&w)
	if w.Len() != 0 {
		t.Errorf("a CPU report printed expert figures: %q", w.String())
	}
}

// TestMedianTimings checks the --timing medians against values worked by
// hand: each field's median on its own (the upper middle of an even
// count), and the GPU idle time as the median of Wall - Device per step.
func TestMedianTimings(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	step := func(wall, dev, hand, enq, wait, dl, ret float64) dsv4.StepTiming {
		return dsv4.StepTiming{Wall: ms(wall), Device: ms(dev), Handoff: ms(hand), Enqueue: ms(enq), Wait: ms(wait), Download: ms(dl), Return: ms(ret)}
	}
	for _, c := range []struct {
		name  string
		steps []dsv4.StepTiming
		want  *stepTimingMs
	}{
		{"none", nil, nil},
		{"one", []dsv4.StepTiming{step(6.5, 6.25, 0.01, 0.03, 6.3, 0.1, 0.02)},
			&stepTimingMs{Wall: 6.5, Device: 6.25, Idle: 0.25, Handoff: 0.01, Enqueue: 0.03, Wait: 6.3, Download: 0.1, Return: 0.02}},
		// Idle per step: 0.5, 0.25, 1.5: median 0.5, not 7 - 6.5.
		{"three", []dsv4.StepTiming{
			step(7, 6.5, 0.02, 0.04, 6.6, 0.2, 0.03),
			step(6.5, 6.25, 0.01, 0.03, 6.3, 0.1, 0.02),
			step(9, 7.5, 0.5, 0.05, 7.9, 0.4, 0.1),
		}, &stepTimingMs{Wall: 7, Device: 6.5, Idle: 0.5, Handoff: 0.02, Enqueue: 0.04, Wait: 6.6, Download: 0.2, Return: 0.03}},
		// Steps run ahead: the idle is each step's Gap, not Wall - Device
		// (the step began before the call that confirmed it). Gaps 0.02,
		// 0.03, 0.01 (Wall - Device would be 1, 0.5, 0.25): median 0.02.
		{"ahead", []dsv4.StepTiming{
			{Wall: ms(7), Device: ms(6), Ahead: true, Gap: ms(0.02)},
			{Wall: ms(6.5), Device: ms(6), Ahead: true, Gap: ms(0.03)},
			{Wall: ms(6.5), Device: ms(6.25), Ahead: true, Gap: ms(0.01)},
		}, &stepTimingMs{Wall: 6.5, Device: 6, Idle: 0.02}},
		{"two: the upper middle", []dsv4.StepTiming{
			step(7, 6.5, 0.02, 0.04, 6.6, 0.2, 0.03),
			step(6.5, 6.25, 0.01, 0.03, 6.3, 0.1, 0.02),
		}, &stepTimingMs{Wall: 7, Device: 6.5, Idle: 0.5, Handoff: 0.02, Enqueue: 0.04, Wait: 6.6, Download: 0.2, Return: 0.03}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := medianTimings(c.steps)
			if (got == nil) != (c.want == nil) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
			if got == nil {
				return
			}
			g := []float64{got.Wall, got.Device, got.Idle, got.Handoff, got.Enqueue, got.Wait, got.Download, got.Return}
			w := []float64{c.want.Wall, c.want.Device, c.want.Idle, c.want.Handoff, c.want.Enqueue, c.want.Wait, c.want.Download, c.want.Return}
			for i := range g {
				if d := g[i] - w[i]; d > 1e-6 || d < -1e-6 {
					t.Errorf("field %d: %g ms, want %g\ngot  %+v\nwant %+v", i, g[i], w[i], got, c.want)
				}
			}
		})
	}
}
