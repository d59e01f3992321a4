package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestDetag(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"sentence", "\n\n\tThe/at jury/nn said/vbd ./.\n", "The jury said.\n"},
		{"quotes", "\tproduced/vbd ``/`` no/at evidence/nn ''/'' that/cs ./.", "produced \"no evidence\" that.\n"},
		{"parens and commas", "\tX/np (/( or/cc Y/np )/) ,/, Z/np ;/. ok/uh ?/.", "X (or Y), Z; ok?\n"},
		{"slash in word", "\t1-1/2/cd miles/nns", "1-1/2 miles\n"},
		{"single quote", "\tthe/at boys/nns '/' hats/nns", "the boys' hats\n"},
		{"two sentences", "\tA/at ./.\n\n\n\tB/np !/.\n", "A.\nB!\n"},
		{"headline tags", "\tNews/nn-hl :/:-hl", "News:\n"},
		{"empty", "\n\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Detag(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("Detag(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
	for _, bad := range []string{"\tword", "\t/nn", "\tword/"} {
		if _, err := Detag(bad); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("Detag(%q) err = %v, want a line-1 error", bad, err)
		}
	}
}

func TestSplit(t *testing.T) {
	var names []string
	for _, g := range "abcdefghjklmnpr" {
		for i := 1; i <= 34; i++ {
			names = append(names, fmt.Sprintf("c%c%02d", g, i))
		}
	}
	names = names[:500]
	train, held := Split(names, 7, 0.1)
	if len(held) != 50 || len(train) != 450 {
		t.Fatalf("split %d/%d, want 450/50", len(train), len(held))
	}
	seen := map[string]bool{}
	for _, n := range append(append([]string{}, train...), held...) {
		if seen[n] {
			t.Fatalf("%s in both parts", n)
		}
		seen[n] = true
	}
	if len(seen) != 500 {
		t.Fatalf("%d documents after the split, want 500", len(seen))
	}
	rev := append([]string(nil), names...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	tr2, h2 := Split(rev, 7, 0.1)
	if !reflect.DeepEqual(h2, held) || !reflect.DeepEqual(tr2, train) {
		t.Error("split depends on the input order")
	}
	_, h3 := Split(names, 8, 0.1)
	if reflect.DeepEqual(h3, held) {
		t.Error("another seed gives the same held-out set")
	}
}

func TestRun(t *testing.T) {
	src := t.TempDir()
	for i := range 20 {
		doc := fmt.Sprintf("\n\n\tDocument/nn %d/cd ./.\n", i)
		if err := os.WriteFile(filepath.Join(src, fmt.Sprintf("cb%02d", i)), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(src, "README"), []byte("not a document"), 0o644)
	out := filepath.Join(t.TempDir(), "data")
	var log1, log2 bytes.Buffer
	if err := run([]string{"-src", src, "-out", out}, &log1); err != nil {
		t.Fatal(err)
	}
	train, _ := os.ReadFile(filepath.Join(out, "train.txt"))
	held, _ := os.ReadFile(filepath.Join(out, "heldout.txt"))
	if strings.Count(string(train), "Document") != 18 || strings.Count(string(held), "Document") != 2 {
		t.Errorf("train %q\nheld %q: want 18 and 2 documents", train, held)
	}
	if err := run([]string{"-src", src, "-out", out}, &log2); err != nil {
		t.Fatal(err)
	}
	if log1.String() != log2.String() {
		t.Errorf("second run differs:\n%s\n%s", log1.String(), log2.String())
	}
	for _, bad := range [][]string{{}, {"-src", src}, {"-src", t.TempDir(), "-out", out}, {"-src", src, "-out", out, "-heldout", "1"}} {
		if err := run(bad, &log1); err == nil {
			t.Errorf("run(%q) succeeded", bad)
		}
	}
}

func FuzzDetag(f *testing.F) {
	f.Add("\tThe/at jury/nn ``/`` said/vbd ''/'' ./.\n")
	f.Add("\t1-1/2/cd (/( x/nn )/)")
	f.Add("/")
	f.Fuzz(func(t *testing.T, doc string) {
		out, err := Detag(doc)
		if err != nil {
			return
		}
		if strings.Contains(out, "\t") {
			t.Fatalf("tab left in %q", out)
		}
	})
}
