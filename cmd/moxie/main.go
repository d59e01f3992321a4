// Command moxie runs DeepSeek-V4-Flash and the tools around it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(args []string, stdin io.Reader, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"run", "chat with a model, or answer one prompt (the built-in miniature by default)", runRun},
		{"serve", "serve a model over an OpenAI-compatible HTTP API", runServe},
		{"bench", "measure prefill and decode speed and efficiency against memory bandwidth", runBench},
		{"plan", "show what a memory budget keeps resident: dense weights, caches, experts per layer", runPlan},
		{"inspect", "list a model's tensors by role, formats, bytes, bytes read per token", runInspect},
		{"perplexity", "measure perplexity and tokens/s on a text file", runPerplexity},
		{"calibrate", "measure REAP saliency of every routed expert on a calibration text (for pruning)", runCalibrate},
		{"logits", "save the logits of a token sequence as .npy (prefill, then decode steps)", runLogits},
		{"tokenize", "turn text into token ids (or ids into text with --decode)", runTokenize},
		{"residency", "replay a route trace through expert-residency policies and the optimum", runResidency},
		{"import-hf", "convert a transformers DeepseekV4ForCausalLM checkpoint to the shipped layout", runImportHF},
		{"synth", "write a synthetic model (tiny or V4-Flash shapes) as a checkpoint directory", runSynth},
		{"repack", "losslessly repack FP8 128x128 block weights to MXFP8 into a new directory", runRepack},
		{"version", "print moxie's version", runVersion},
	}
}

const version = "0.1.0-dev"

// builtinModel is the built-in default model: the trained miniature of
// DeepSeek-V4 (issue 8) shipped in the repository's models/brown-mini.
const builtinModel = "models/brown-mini"

// defaultModel returns the model used when --model is not given: $MOXIE_MODEL
// if set, else the first models/brown-mini found in the working directory or
// one of its parents (so any directory of the repository works), or beside the
// executable; else builtinModel itself, which loadModel reports as missing
// with what to do.
func defaultModel() string {
	if m := os.Getenv("MOXIE_MODEL"); m != "" {
		return m
	}
	var roots []string
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			roots = append(roots, d)
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if exe, err := os.Executable(); err == nil {
		roots = append(roots, filepath.Dir(exe), filepath.Dir(filepath.Dir(exe)))
	}
	for _, r := range roots {
		d := filepath.Join(r, builtinModel)
		if _, err := os.Stat(filepath.Join(d, "config.json")); err == nil {
			if rel, err := filepath.Rel(mustGetwd(), d); err == nil && len(rel) < len(d) {
				return rel
			}
			return d
		}
	}
	return builtinModel
}

func mustGetwd() string {
	wd, _ := os.Getwd()
	return wd
}

func usage(w io.Writer) {
	fmt.Fprintf(w, `moxie runs DeepSeek-V4-Flash (284B-parameter MoE) from its official checkpoint.

Usage: moxie COMMAND [flags] [args]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, `
A MODEL is a checkpoint directory (config.json, model.safetensors.index.json and
shards, as shipped by DeepSeek) or a synthetic model "synth:PRESET[?key=value&...]":
  synth:tiny                  every V4 block type at toy widths (tests, demos)
  synth:flash                 the exact V4-Flash shapes (159.6 GB, generated on demand)
  synth:flash?layers=2&experts=16&seed=1
Synthetic weights are random: their output is meaningless text.

Run "moxie COMMAND --help" for a command's flags.
`)
}

func main() {
	stop, err := startProfile(os.Getenv("MOXIE_CPUPROFILE"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "moxie: %v\n", err)
		os.Exit(1)
	}
	code := run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	if err := stop(); err != nil {
		fmt.Fprintf(os.Stderr, "moxie: %v\n", err)
	}
	os.Exit(code)
}

// startProfile starts a CPU profile of the whole command into path
// ($MOXIE_CPUPROFILE; read it with go tool pprof) and returns what stops
// and writes it; with path empty it does nothing.
func startProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("MOXIE_CPUPROFILE: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("MOXIE_CPUPROFILE %s: %w", path, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("MOXIE_CPUPROFILE %s: %w", path, err)
		}
		return nil
	}, nil
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			err := c.run(args[1:], stdin, stdout, stderr)
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			if err != nil {
				fmt.Fprintf(stderr, "moxie %s: %v\n", c.name, err)
				var ue usageError
				if errors.As(err, &ue) {
					return 2
				}
				return 1
			}
			return 0
		}
	}
	fmt.Fprintf(stderr, "moxie: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

// usageError marks errors in how a command was called (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// newFlags makes a FlagSet whose --help prints the summary, usage line and flags.
func newFlags(name, usageLine, about string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: moxie %s %s\n\n%s\n", name, usageLine, strings.TrimSpace(about))
		var hasFlags bool
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintf(stderr, "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parseFlags parses args, turning flag errors into usage errors. Flags may
// come after positional arguments ("moxie synth tiny --out DIR"); "--" ends the
// flags.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(reorderArgs(fs, args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	return nil
}

// reorderArgs moves the flags in args, with the values of those that take one
// (every flag of fs except booleans), before the positional arguments, and
// puts "--" between them so that a positional argument starting with "-"
// (given after "--") stays positional.
func reorderArgs(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if !strings.Contains(name, "=") && takesValue(fs, name) && i+1 < len(args) {
				flags = append(flags, args[i+1])
				i++
			}
			continue
		}
		pos = append(pos, a)
	}
	return append(append(flags, "--"), pos...)
}

// takesValue reports whether fs has a flag name that needs a value (any
// non-boolean flag).
func takesValue(fs *flag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

func runVersion(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("version", "", "Print moxie's version.", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "moxie %s\n", version)
	return nil
}
