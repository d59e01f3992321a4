package cuda

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// FuzzEnvSwitches runs every parser of a $MOXIE_CUDA_* value on the same
// input: none may panic; each either fails with an error that quotes what
// it could not read, or returns a value within its documented range that
// reads back the same when written out again.
func FuzzEnvSwitches(f *testing.F) {
	for _, s := range []string{"", "off", "moe1lx:44", "moe1lx:44,gemvm:0", "gemvm:101", ":5", "a:1,,b:2",
		"g8k16", "g8k16:64", "g8k16:65", "g8k16db:0", "leanxw", "wide", "wide:8", "wide:9", "wide:-1",
		"old", "new", "short", "one", "two", "bulk", "lines_el", "q,o:bulk"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		quoted := func(what string, err error, part string) {
			if !strings.Contains(err.Error(), strconv.Quote(part)) {
				t.Errorf("%s(%q): error %q does not quote the value", what, v, err)
			}
		}
		for _, major := range []int{8, 9} {
			rules, err := parseCarve(v, major)
			if err != nil {
				quoted("parseCarve", err, v)
				continue
			}
			var parts []string
			for _, r := range rules {
				if r.prefix == "" || r.percent < 0 || r.percent > 100 {
					t.Fatalf("parseCarve(%q) gave the rule %+v", v, r)
				}
				parts = append(parts, fmt.Sprintf("%s:%d", r.prefix, r.percent))
			}
			if len(parts) > 0 && v != "" {
				back, err := parseCarve(strings.Join(parts, ","), major)
				if err != nil || fmt.Sprint(back) != fmt.Sprint(rules) {
					t.Errorf("parseCarve(%q) = %v, which reads back as %v (%v)", v, rules, back, err)
				}
			}
		}
		if ch, err := ParseAttnDecChoice(v); err != nil {
			name, _, _ := strings.Cut(v, ":")
			if !strings.Contains(err.Error(), strconv.Quote(v)) && !strings.Contains(err.Error(), strconv.Quote(name)) {
				t.Errorf("ParseAttnDecChoice(%q): error %q quotes neither the value nor its tiling", v, err)
			}
		} else {
			if _, err := ch.variant(); err != nil {
				t.Errorf("ParseAttnDecChoice(%q) = %+v, which does not resolve: %v", v, ch, err)
			}
			if ch.MaxSplits < 0 || ch.MaxSplits > attnDecScratchSplits || ch.Early != 0 {
				t.Errorf("ParseAttnDecChoice(%q) = %+v", v, ch)
			}
			if ch.Variant != "" {
				s := ch.Variant
				if ch.MaxSplits > 0 {
					s += ":" + strconv.Itoa(ch.MaxSplits)
				}
				if back, err := ParseAttnDecChoice(s); err != nil || back != ch {
					t.Errorf("ParseAttnDecChoice(%q) = %+v, which reads back as %+v (%v)", v, ch, back, err)
				}
			}
		}
		if mv, err := ParseMoEVariant(v); err != nil {
			quoted("ParseMoEVariant", err, v)
		} else if mv < 0 || mv >= moeVariantCount || (v != "" && moeVariants[mv].name != v) {
			t.Errorf("ParseMoEVariant(%q) = %d", v, mv)
		}
		if pm, err := ParsePrefetchMode(v); err != nil {
			quoted("ParsePrefetchMode", err, v)
		} else if int(pm) < 0 || int(pm) >= len(prefetchModeNames) {
			t.Errorf("ParsePrefetchMode(%q) = %d", v, pm)
		}
		if gv, err := ParseGateRouteVariant(v); err != nil {
			quoted("ParseGateRouteVariant", err, v)
		} else if gv.Warps < 0 || gv.Warps > gateRouteMaxWarps || (gv.Warps > 0 && !gv.Wide) {
			t.Errorf("ParseGateRouteVariant(%q) = %+v", v, gv)
		}
		if _, err := ParseHCFuseVariant(v); err != nil {
			quoted("ParseHCFuseVariant", err, v)
		}
		if _, err := ParseHCFinishVariant(v); err != nil {
			quoted("ParseHCFinishVariant", err, v)
		}
		if _, err := ParseHCDots(v, 1); err != nil {
			quoted("ParseHCDots", err, v)
		}
		if _, err := ParseHCPrefill(v); err != nil {
			quoted("ParseHCPrefill", err, v)
		}
	})
}
