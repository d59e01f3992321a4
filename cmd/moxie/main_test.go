package main

import (
	"bytes"
	"crypto/sha256"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"moxie/checkpoint"
	"moxie/dsv4/config"
	"moxie/format"
)

// moxie runs the CLI in-process and returns its exit code, stdout and stderr.
func moxie(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func TestInspectFlashTotals(t *testing.T) {
	code, out, errs := moxie(t, "inspect", "synth:flash")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{
		"SYNTHETIC",
		"159,609,485,896", // the shipped index total_size, dsv4-flash.md §5.4
		"147,169,738,752", // routed experts
		"3,593,787,756",   // MTP block
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"bogus"}, {"inspect"}, {"inspect", "a", "b"}, {"synth", "tiny"}, {"repack", "x"}, {"inspect", "--nope", "synth:tiny"}} {
		if code, _, errs := moxie(t, args...); code != 2 || errs == "" {
			t.Errorf("moxie %v: exit %d, stderr %q; want exit 2 with a message", args, code, errs)
		}
	}
	if code, _, errs := moxie(t, "inspect", "/nonexistent/model"); code != 1 || !strings.Contains(errs, "/nonexistent/model") {
		t.Errorf("inspect of a missing dir: exit %d, stderr %q", code, errs)
	}
	if code, _, _ := moxie(t, "inspect", "--help"); code != 0 {
		t.Errorf("--help exit %d, want 0", code)
	}
}

func TestSynthDirReadsBackAsGenerated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	if code, _, errs := moxie(t, "synth", "tiny?seed=7", "--out", dir, "--shard-size", "256KiB"); code != 0 {
		t.Fatalf("synth: exit %d: %s", code, errs)
	}
	gen, err := checkpoint.OpenSynth("synth:tiny?seed=7")
	if err != nil {
		t.Fatal(err)
	}
	d, err := checkpoint.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Shards() < 5 {
		t.Fatalf("%d shards, want several at 256 KiB", d.Shards())
	}
	if !d.Synthetic() {
		t.Fatal("directory written by synth does not say it is synthetic")
	}
	if len(d.Tensors()) != len(gen.Tensors()) {
		t.Fatalf("%d tensors read back, generator has %d", len(d.Tensors()), len(gen.Tensors()))
	}
	for _, ti := range gen.Tensors() {
		want, _ := gen.TensorData(ti.Name)
		got, err := d.TensorData(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s differs after the round trip", ti.Name)
		}
		if li, _ := d.Lookup(ti.Name); li.DType != ti.DType || len(li.Shape) != len(ti.Shape) {
			t.Fatalf("%s: dtype/shape %v %v, want %v %v", ti.Name, li.DType, li.Shape, ti.DType, ti.Shape)
		}
	}
	for _, f := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		want, _ := gen.File(f)
		got, err := d.File(f)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s differs or is missing (%v)", f, err)
		}
	}
	// Writing over an existing directory is refused.
	if code, _, errs := moxie(t, "synth", "tiny", "--out", dir); code != 1 || !strings.Contains(errs, "already exists") {
		t.Fatalf("synth over an existing dir: exit %d, %s", code, errs)
	}
}

func hashTree(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	m := map[string][32]byte{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = sha256.Sum256(b)
	}
	return m
}

func TestRepackIsExactAndLeavesSourceAlone(t *testing.T) {
	tmp := t.TempDir()
	src, dst := filepath.Join(tmp, "src"), filepath.Join(tmp, "dst")
	if code, _, errs := moxie(t, "synth", "tiny", "--out", src); code != 0 {
		t.Fatal(errs)
	}
	before := hashTree(t, src)
	code, out, errs := moxie(t, "repack", src, "--out", dst)
	if code != 0 {
		t.Fatalf("repack: exit %d: %s", code, errs)
	}
	if after := hashTree(t, src); len(after) != len(before) {
		t.Fatal("repack changed the source directory's files")
	} else {
		for k, v := range before {
			if after[k] != v {
				t.Fatalf("repack modified %s in the source", k)
			}
		}
	}
	s, _ := checkpoint.OpenDir(src)
	defer s.Close()
	d, err := checkpoint.OpenDir(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cfgJSON, _ := d.File("config.json")
	cfg, err := config.Parse(cfgJSON)
	if err != nil || cfg.DenseFormat != "mxfp8" {
		t.Fatalf("repacked config: %v, dense format %q", err, cfg.DenseFormat)
	}
	repacked := 0
	for _, lt := range config.Layout(cfg) {
		if _, ok := d.Lookup(lt.Name); !ok {
			t.Fatalf("repacked checkpoint lacks %s", lt.Name)
		}
		if lt.DType != format.F8E4M3 {
			a, _ := s.TensorData(lt.Name)
			b, _ := d.TensorData(lt.Name)
			if lt.ScaleOf == "" && !bytes.Equal(a, b) {
				t.Fatalf("%s was not copied byte for byte", lt.Name)
			}
			continue
		}
		base := strings.TrimSuffix(lt.Name, ".weight")
		rows, cols := int(lt.Shape[0]), int(lt.Shape[1])
		q, _ := s.TensorData(lt.Name)
		bs, _ := s.TensorData(base + ".scale")
		want, err := format.DequantFP8Block(q, bs, rows, cols, 128)
		if err != nil {
			t.Fatal(err)
		}
		q2, _ := d.TensorData(lt.Name)
		ms, _ := d.TensorData(base + ".scale")
		got, err := format.DequantMXFP8(q2, ms, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[i] != want[i] && !(got[i] != got[i] && want[i] != want[i]) {
				t.Fatalf("%s[%d] = %g after repack, %g before", lt.Name, i, got[i], want[i])
			}
		}
		repacked++
		if !strings.Contains(out, lt.Name) || !strings.Contains(out, base+".scale") {
			t.Fatalf("report does not name %s and its new scale", lt.Name)
		}
	}
	if repacked == 0 {
		t.Fatal("nothing was repacked")
	}
	if _, err := inspect(d); err != nil {
		t.Fatalf("inspect of the repacked checkpoint: %v", err)
	}
}

func TestRepackRefusesNaNScale(t *testing.T) {
	tmp := t.TempDir()
	gen, _ := checkpoint.OpenSynth("synth:tiny")
	aux, _ := checkpoint.AuxFiles(gen)
	tensors := gen.OutTensors()
	for i, ot := range tensors {
		if ot.Name == "layers.2.attn.wkv.scale" {
			tensors[i].Data = func() ([]byte, error) {
				b, err := gen.TensorData(ot.Name)
				b[0] = 0xFF // E8M0 NaN
				return b, err
			}
		}
	}
	src := filepath.Join(tmp, "bad")
	if err := checkpoint.WriteDir(src, aux, tensors, checkpoint.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(tmp, "out")
	code, _, errs := moxie(t, "repack", src, "--out", dst)
	if code != 1 || !strings.Contains(errs, "layers.2.attn.wkv.weight") || !strings.Contains(strings.ToLower(errs), "nan") {
		t.Fatalf("exit %d, stderr %q: want an error naming layers.2.attn.wkv.weight and the NaN scale", code, errs)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Fatalf("a refused repack left %s behind", dst)
	}
}

// TestHelpArgNames checks every command's --help: it exits 0, and each
// flag line names the flag's argument, if any, in one word (the flag
// package takes a usage string's first back-quoted text as that name, so
// back-quoted prose in a boolean flag's usage shows up as a bogus argument).
func TestHelpArgNames(t *testing.T) {
	flagLine := regexp.MustCompile(`^  -([a-z0-9-]+)(?: (.*))?$`)
	for _, c := range commands() {
		t.Run(c.name, func(t *testing.T) {
			code, _, errs := moxie(t, c.name, "--help")
			if code != 0 {
				t.Fatalf("exit %d, want 0; stderr %q", code, errs)
			}
			for _, l := range strings.Split(errs, "\n") {
				m := flagLine.FindStringSubmatch(l)
				if m == nil {
					continue
				}
				if arg := m[2]; strings.ContainsAny(arg, " \t") {
					t.Errorf("-%s takes %q: an argument name is one word (back quotes in its usage?)", m[1], arg)
				}
			}
		})
	}
}
