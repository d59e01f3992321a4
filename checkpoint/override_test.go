package checkpoint

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func TestWithTensors(t *testing.T) {
	dir := writeTinyDir(t)
	for _, name := range []string{"synth:tiny", dir} {
		t.Run(map[bool]string{true: "synth", false: "dir"}[strings.HasPrefix(name, "synth:")], func(t *testing.T) {
			src, err := Open(name)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			const target, other = "layers.3.ffn.gate.bias", "layers.3.ffn.gate.weight"
			info, ok := src.Lookup(target)
			if !ok {
				t.Fatalf("%s has no %s", name, target)
			}
			repl := bytes.Repeat([]byte{0x5a}, int(info.Size))
			o, err := WithTensors(src, map[string][]byte{target: repl})
			if err != nil {
				t.Fatal(err)
			}
			got, err := o.TensorData(target)
			if err != nil || !bytes.Equal(got, repl) {
				t.Fatalf("TensorData(%s): %v, replaced bytes %v", target, err, bytes.Equal(got, repl))
			}
			want, _ := src.TensorData(other)
			if got, _ := o.TensorData(other); !bytes.Equal(got, want) {
				t.Errorf("TensorData(%s) differs from the source's", other)
			}
			if !reflect.DeepEqual(o.Tensors(), src.Tensors()) || o.Name() != src.Name() || o.Synthetic() != src.Synthetic() {
				t.Error("the wrapper does not describe the source's tensors, name and kind")
			}
			if !reflect.DeepEqual(auxNames(o), auxNames(src)) {
				t.Errorf("auxiliary files %v, the source's %v", auxNames(o), auxNames(src))
			}
			_, srcLoc := src.(Locator)
			loc, oLoc := o.(Locator)
			if srcLoc != oLoc {
				t.Fatalf("source Locator %v, wrapper %v", srcLoc, oLoc)
			}
			if oLoc {
				if _, _, _, err := loc.Locate(target); err == nil || !strings.Contains(err.Error(), "replaced in memory") {
					t.Errorf("Locate(%s): %v, want a refusal", target, err)
				}
				p1, off1, n1, err1 := loc.Locate(other)
				p2, off2, n2, err2 := src.(Locator).Locate(other)
				if err1 != nil || p1 != p2 || off1 != off2 || n1 != n2 || err2 != nil {
					t.Errorf("Locate(%s) = %s %d %d %v, the source's %s %d %d %v", other, p1, off1, n1, err1, p2, off2, n2, err2)
				}
			}
			for _, bad := range []struct {
				data map[string][]byte
				want string
			}{
				{map[string][]byte{"no.such.tensor": nil}, "no tensor"},
				{map[string][]byte{target: repl[1:]}, "want the stored"},
			} {
				if _, err := WithTensors(src, bad.data); err == nil || !strings.Contains(err.Error(), bad.want) {
					t.Errorf("WithTensors(%v): %v, want an error containing %q", reflect.ValueOf(bad.data).MapKeys(), err, bad.want)
				}
			}
		})
	}
}
