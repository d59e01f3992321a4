package dsv4

import (
	"strings"
	"testing"

	"moxie/compute/cuda"
)

// TestMoEVariantFromEnv checks the $MOXIE_CUDA_MOE switch: unset selects
// the default fused kernels, "off" the unfused ones, a variant's name that
// variant, and anything else is an error naming the variable.
func TestMoEVariantFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env    string
		want   cuda.MoEVariant
		on, ok bool
	}{
		{"", cuda.MoEPreferred, true, true},
		{"off", 0, false, true},
		{cuda.MoEVariant(1).String(), cuda.MoEVariant(1), true, true},
		{cuda.MoEVariant(2).String(), cuda.MoEVariant(2), true, true},
		{"fast", 0, false, false},
		{"MoEVariant(9)", 0, false, false},
	} {
		t.Run("env="+tc.env, func(t *testing.T) {
			t.Setenv("MOXIE_CUDA_MOE", tc.env)
			v, on, err := moeVariantFromEnv()
			if (err == nil) != tc.ok {
				t.Fatalf("error %v, want ok=%v", err, tc.ok)
			}
			if err != nil {
				if !strings.Contains(err.Error(), "MOXIE_CUDA_MOE") {
					t.Errorf("error %q does not name the variable", err)
				}
				return
			}
			if v != tc.want || on != tc.on {
				t.Errorf("got (%v, %v), want (%v, %v)", v, on, tc.want, tc.on)
			}
		})
	}
}
