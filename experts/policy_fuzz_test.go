package experts

import (
	"strings"
	"testing"
)

// FuzzParsePolicy: a spec (other than static:FILE, which reads a file) is
// refused or gives a policy that builds and a canonical name that parses
// to itself.
func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{"", "lru", "lru:x", "decay", "decay:h=32", "decay:h=0", "decay:ratio=1.5,margin=2",
		"decay:h=NaN", "decay:h=1e400", "decay:z=1", "decay:h=", "decay:,", "static:", "bogus"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		if strings.HasPrefix(spec, "static:") {
			return
		}
		fn, name, err := ParsePolicy(spec)
		if err != nil {
			if fn != nil || name != "" {
				t.Fatalf("ParsePolicy(%q) failed (%v) but returned a policy", spec, err)
			}
			return
		}
		if fn == nil || name == "" {
			t.Fatalf("ParsePolicy(%q): no policy or no name", spec)
		}
		if p := fn(0, 8, 4); p == nil {
			t.Fatalf("ParsePolicy(%q): the policy function built nothing", spec)
		}
		_, again, err := ParsePolicy(name)
		if err != nil || again != name {
			t.Fatalf("ParsePolicy(%q) named %q, which parses to %q (%v)", spec, name, again, err)
		}
	})
}
