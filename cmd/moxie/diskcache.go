package main

import (
	"flag"
	"fmt"
	"io"

	"moxie/generate"
)

// diskFlags are --cache-dir and --cache-disk: the prompt cache's disk tier.
type diskFlags struct {
	dir, budget string
	every       int
}

func addDiskFlags(fs *flag.FlagSet) *diskFlags {
	f := &diskFlags{}
	fs.StringVar(&f.dir, "cache-dir", "", "also keep sequences on disk in this directory: each conversation evicted from memory or held at exit, and a checkpoint at the end of the system prompt, are written there, and a later prompt that extends one (the next turn, or another conversation with the same system prompt, in this process or a later one) restores it instead of prefilling (off by default)")
	fs.StringVar(&f.budget, "cache-disk", "16GiB", "with --cache-dir: the most disk space its files may take; the least recently used are removed beyond it")
	fs.IntVar(&f.every, "cache-every", 0, "with --cache-dir: also save a prefill's state every N prompt tokens, so that a later prompt sharing a long start with it (a document, then another question) restores the last save inside the shared part (0: only at the end of the system prompt)")
	return f
}

// options returns the disk tier's options (nil without --cache-dir), or a
// usage error. Background errors are printed to stderr.
func (f *diskFlags) options(stderr io.Writer) (*generate.DiskOptions, error) {
	if f.dir == "" {
		return nil, nil
	}
	if f.every < 0 {
		return nil, usagef("--cache-every %d: want 0 or more tokens", f.every)
	}
	budget, err := parseBytes(f.budget)
	if err != nil || budget <= 0 {
		return nil, usagef("--cache-disk %q: want a size such as 16GiB", f.budget)
	}
	return &generate.DiskOptions{Dir: f.dir, Budget: budget, MinTokens: 64, Every: f.every,
		OnError: func(err error) { fmt.Fprintf(stderr, "moxie: prompt cache on disk: %v\n", err) }}, nil
}
