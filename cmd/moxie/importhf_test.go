package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"moxie/checkpoint"
	"moxie/dsv4"
	"moxie/safetensors"
)

// hfTinyDir writes synth:tiny as a transformers checkpoint directory.
func hfTinyDir(t *testing.T) string {
	t.Helper()
	src, err := checkpoint.Open("synth:tiny")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "hf")
	if err := checkpoint.ExportHF(src, dir, checkpoint.ExportHFOptions{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestImportHF(t *testing.T) {
	hf := hfTinyDir(t)
	out := filepath.Join(t.TempDir(), "model")
	var stdout, stderr bytes.Buffer
	if err := runImportHF([]string{hf, "--out", out, "--shard-size", "200KiB"}, nil, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "wrote "+out) {
		t.Errorf("stdout %q", stdout.String())
	}
	src, err := checkpoint.OpenDir(out)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if src.Shards() < 4 {
		t.Errorf("%d shards, want several at 200 KiB", src.Shards())
	}
	ix, err := safetensors.ReadIndex(filepath.Join(out, checkpoint.IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, shard := range ix.Shards() {
		st, err := os.Stat(filepath.Join(out, shard))
		if err != nil {
			t.Fatal(err)
		}
		// One tensor may exceed the limit on its own; tiny has none over 200 KiB.
		if st.Size() > 200<<10+64<<10 {
			t.Errorf("%s is %d bytes, over the 200 KiB limit plus header", shard, st.Size())
		}
	}
	m, err := dsv4.Load(src, dsv4.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Cfg.NMTPLayers != 0 || m.Cfg.NLayers != 4 {
		t.Errorf("config: %d layers, %d MTP, want 4 and 0", m.Cfg.NLayers, m.Cfg.NMTPLayers)
	}
	if _, err := src.File("tokenizer.json"); err != nil {
		t.Errorf("tokenizer.json not copied: %v", err)
	}
}

func TestImportHFUsage(t *testing.T) {
	hf := hfTinyDir(t)
	exists := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no args", nil, "want one SRC"},
		{"no out", []string{hf}, "want one SRC"},
		{"two sources", []string{hf, hf, "--out", "x"}, "want one SRC"},
		{"bad shard", []string{hf, "--out", "x", "--shard-size", "big"}, "--shard-size"},
		{"out exists", []string{hf, "--out", exists}, "already exists"},
		{"not a checkpoint", []string{exists, "--out", filepath.Join(exists, "o")}, "config.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := runImportHF(tc.args, nil, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}
