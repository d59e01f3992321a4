//go:build moxie_knockout

package cuda

import "testing"

func TestKnockedOut(t *testing.T) {
	for _, c := range []struct {
		ko, name string
		want     bool
	}{
		{"", "fuse_hc_finish4", false},
		{"fuse_hc_finish", "fuse_hc_finish4", true},
		{"fuse_hc_finish", "fuse_hc_dots4", false},
		{"fuse_rows,attndec_combine", "attndec_combine_r", true},
		{",,fuse_rows,", "fuse_rows", true},
		{"idx_topk", "idx_scores_h4", false},
	} {
		t.Run(c.ko+"/"+c.name, func(t *testing.T) {
			t.Setenv("MOXIE_KO", c.ko)
			if got := knockedOut(c.name); got != c.want {
				t.Errorf("MOXIE_KO=%q: knockedOut(%q) = %v, want %v", c.ko, c.name, got, c.want)
			}
		})
	}
}
