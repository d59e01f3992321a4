package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartProfile: MOXIE_CPUPROFILE writes a gzip-compressed profile
// (pprof's format) when the command ends; an empty path does nothing; a
// path that cannot be created is an error naming the variable.
func TestStartProfile(t *testing.T) {
	t.Run("written", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "cpu.pprof")
		stop, err := startProfile(path)
		if err != nil {
			t.Fatal(err)
		}
		x := 0
		for i := range 1_000_000 {
			x += i * i
		}
		_ = x
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
			t.Errorf("profile of %d bytes starts %x, want gzip's 1f8b", len(b), b[:min(len(b), 2)])
		}
	})
	t.Run("off", func(t *testing.T) {
		stop, err := startProfile("")
		if err != nil || stop() != nil {
			t.Fatalf("empty path: %v", err)
		}
	})
	t.Run("bad path", func(t *testing.T) {
		_, err := startProfile(filepath.Join(t.TempDir(), "missing", "cpu.pprof"))
		if err == nil || !strings.Contains(err.Error(), "MOXIE_CPUPROFILE") {
			t.Fatalf("err %v, want one naming MOXIE_CPUPROFILE", err)
		}
	})
}
