package tokenizer

import (
	"encoding/json"
	"fmt"
	"moxie/internal/cputime"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

func TestAlphabet(t *testing.T) {
	enc, dec := byteLevelAlphabet()
	want := gpt2Alphabet()
	if enc != want {
		t.Fatalf("byteLevelAlphabet differs from GPT-2's bytes_to_unicode")
	}
	// Known spellings: space is Ġ, newline Ċ, tab ĉ.
	for b, r := range map[byte]rune{' ': 'Ġ', '\n': 'Ċ', '\t': 'ĉ', 'a': 'a', 0xFF: 'ÿ'} {
		if enc[b] != r || dec[r] != b {
			t.Errorf("byte %#x: got %q, want %q", b, enc[b], r)
		}
	}
}

func TestTinyModelTokenizer(t *testing.T) {
	tok, err := Load(tinyTokenizerJSON(), []byte(tinyConfigJSON))
	if err != nil {
		t.Fatal(err)
	}
	if !tok.IsSpecial(0) || !tok.IsSpecial(261) || tok.IsSpecial(3+'a') || tok.IsSpecial(-1) || tok.IsSpecial(1<<30) {
		t.Error("IsSpecial wrong")
	}
	if tok.VocabSize() != 288 {
		t.Errorf("VocabSize = %d, want 288", tok.VocabSize())
	}
	if id, ok := tok.BOS(); !ok || id != 0 {
		t.Errorf("BOS = %d %v", id, ok)
	}
	if id, ok := tok.EOS(); !ok || id != 1 {
		t.Errorf("EOS = %d %v", id, ok)
	}
	tests := []struct {
		name string
		text string
		opt  EncodeOptions
		want []int
	}{
		{"bytes", "hi", EncodeOptions{}, []int{3 + 'h', 3 + 'i'}},
		{"utf8", "é", EncodeOptions{}, []int{3 + 0xC3, 3 + 0xA9}},
		{"special allowed", "<｜User｜>hi<think>", EncodeOptions{AllowSpecial: true}, []int{259, 3 + 'h', 3 + 'i', 261}},
		{"special as text", "<think>", EncodeOptions{}, []int{3 + '<', 3 + 't', 3 + 'h', 3 + 'i', 3 + 'n', 3 + 'k', 3 + '>'}},
		{"no bos (add_bos_token false)", "a", EncodeOptions{AddSpecialTokens: true}, []int{3 + 'a'}},
		{"placeholder", "<｜place▁holder▁no▁24｜>", EncodeOptions{AllowSpecial: true}, []int{287}},
		{"empty", "", EncodeOptions{AllowSpecial: true}, []int{}},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			got := tok.Encode(c.text, c.opt)
			if !slices.Equal(got, c.want) {
				t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
			}
			if d := tok.Decode(got); d != c.text {
				t.Errorf("Decode = %q, want %q", d, c.text)
			}
		})
	}
}

func TestBPEMerges(t *testing.T) {
	tok := loadMergeTokenizer(t)
	id := func(s string) int {
		i, ok := tok.TokenID(bl(s))
		if !ok {
			t.Fatalf("no token %q", s)
		}
		return i
	}
	tests := []struct {
		text string
		want []string // expected pieces, worked out by hand from englishMerges
	}{
		{"the", []string{"the"}},
		{" the", []string{" ", "the"}}, // "t h" outranks " t"
		{" and then", []string{" a", "n", "d", " ", "the", "n"}},
		{"there", []string{"the", "re"}},
		{"ring", []string{"r", "ing"}},
		{"aaaaa", []string{"aaaa", "a"}},
		{"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", // 65 a's: heap path
			append(slices.Repeat([]string{"aaaa"}, 16), "a")},
		{"1234", []string{"123", "4"}},
		{"         x", []string{"    ", "    ", " x"[:1], "x"}},
		{"\n\n\n", []string{"\n\n", "\n"}},
	}
	for _, c := range tests {
		t.Run(fmt.Sprintf("%q", c.text), func(t *testing.T) {
			var want []int
			for _, p := range c.want {
				want = append(want, id(p))
			}
			if got := tok.Encode(c.text, EncodeOptions{}); !slices.Equal(got, want) {
				t.Errorf("Encode(%q) = %v, want %v", c.text, got, want)
			}
		})
	}
}

func TestMergeHeapMatchesNaive(t *testing.T) {
	tok := loadMergeTokenizer(t)
	words := []string{"thethethe", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
		"andandandingingthere", strings.Repeat("the", 40), strings.Repeat("a", 101), strings.Repeat("12", 33)}
	for _, w := range words {
		syms := func() []int32 {
			var s []int32
			for i := 0; i < len(w); i++ {
				s = append(s, tok.bpe.byteID[w[i]])
			}
			return s
		}
		n := tok.bpe.mergeNaive(syms())
		h := tok.bpe.mergeHeap(syms())
		if !slices.Equal(n, h) {
			t.Errorf("%q: naive %v, heap %v", w, n, h)
		}
	}
}

func TestSplitBehaviors(t *testing.T) {
	// Expected values: the HF tokenizers documentation of
	// SplitDelimiterBehavior, for "the-final--countdown" split on "-".
	tests := []struct {
		beh    behavior
		invert bool
		want   []string
	}{
		{behRemoved, false, []string{"the", "final", "countdown"}},
		{behIsolated, false, []string{"the", "-", "final", "-", "-", "countdown"}},
		{behMergedWithPrevious, false, []string{"the-", "final-", "-", "countdown"}},
		{behMergedWithNext, false, []string{"the", "-final", "-", "-countdown"}},
		{behContiguous, false, []string{"the", "-", "final", "--", "countdown"}},
		{behRemoved, true, []string{"-", "-", "-"}},
	}
	for _, c := range tests {
		t.Run(fmt.Sprintf("%d/%v", c.beh, c.invert), func(t *testing.T) {
			var got []string
			(&splitStep{m: literalMatcher{"-"}, behavior: c.beh, invert: c.invert}).split("the-final--countdown", func(p string) { got = append(got, p) })
			if !slices.Equal(got, c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// dsv3Cases are strings that exercise every alternative of the DeepSeek-V3
// pattern and its backtracking corners.
var dsv3Cases = []string{
	"", "a", " ", "  ", "a  b\n", "a \n b", "hello world", " hello", "\thello", "\nhello", "x\r\n\r\ny",
	"$abc", "!a!b", "'s 're", "$ab$", "  ...\n\nx", " ..x", "..\r\n", "a.b,c", "1abc", "123 456",
	"\u0301abc", "x\u0301", " \u0301", "\u0301 ", "e\u0301\u0302!", "中文テスト。", "ゝゞ゛゜ー",
	"a\u0085b", "\u0085\u0085x", "a\ufeffb", "x\u00a0\u00a0y", "\u3000\u3000中", "  \t  x", "x   ",
	"\x00\x01ab", "a\xffb", "\xff\xfe", "\xe4\xb8", "😀😀 a😀", "👨\u200d👩", "١٢٣٤abc", "²³¼x",
	"a\r\rb", "\r", "\n \n", "tab\t\tend\t", "  \n  x", "@@@", " @@@\n\n", "A-Za-z_", "[x]", "\\n",
}

func TestDSV3ScannersMatchRegexp2(t *testing.T) {
	for _, p := range []string{dsv3DigitsPattern, dsv3CJKPattern, dsv3MainPattern} {
		fast := fastMatcher(p)
		slow := &regexMatcher{re: regexp2.MustCompile(p, regexp2.None)}
		for _, s := range dsv3Cases {
			if g, w := matches(fast, s), matches(slow, s); !slices.Equal(g, w) {
				t.Errorf("pattern %q on %q: scanner %v, regexp2 %v", p, s, g, w)
			}
		}
	}
}

// regexp2Sequence is the DeepSeek-V3 pre-tokenizer built from regexp2 only.
func regexp2Sequence() preTokenizer {
	var seq sequence
	for _, p := range []string{dsv3DigitsPattern, dsv3CJKPattern, dsv3MainPattern} {
		seq = append(seq, &splitStep{m: &regexMatcher{re: regexp2.MustCompile(p, regexp2.None)}, behavior: behIsolated})
	}
	return append(seq, &byteLevelStep{})
}

func pieces(p preTokenizer, s string) []string {
	var out []string
	p.split(s, func(x string) { out = append(out, x) })
	return out
}

func TestFusedDSV3MatchesRegexp2(t *testing.T) {
	tok := loadMergeTokenizer(t)
	fused, ok := tok.pretok.(*dsv3PreTokenizer)
	if !ok {
		t.Fatalf("DeepSeek-V3 pre_tokenizer was not fused: %T", tok.pretok)
	}
	slow := regexp2Sequence()
	for _, s := range append(dsv3Cases, "ab12345cd", "x１２３４y", "中文123テスト。a") {
		if g, w := pieces(fused, s), pieces(slow, s); !slices.Equal(g, w) {
			t.Errorf("%q: fused %q, regexp2 %q", s, g, w)
		}
	}
}

func matches(m matcher, s string) []int {
	var out []int
	m.eachMatch(s, func(a, b int) { out = append(out, a, b) })
	return out
}

func FuzzDSV3Split(f *testing.F) {
	for _, s := range dsv3Cases {
		f.Add(s)
	}
	var ms [3][2]matcher
	for i, p := range []string{dsv3DigitsPattern, dsv3CJKPattern, dsv3MainPattern} {
		ms[i] = [2]matcher{fastMatcher(p), &regexMatcher{re: regexp2.MustCompile(p, regexp2.None)}}
	}
	fused := fuseDSV3(sequence{
		&splitStep{m: fastMatcher(dsv3DigitsPattern), behavior: behIsolated},
		&splitStep{m: fastMatcher(dsv3CJKPattern), behavior: behIsolated},
		&splitStep{m: fastMatcher(dsv3MainPattern), behavior: behIsolated},
		&byteLevelStep{},
	})
	slow := regexp2Sequence()
	f.Fuzz(func(t *testing.T, s string) {
		for _, m := range ms {
			if g, w := matches(m[0], s), matches(m[1], s); !slices.Equal(g, w) {
				t.Fatalf("on %q: scanner %v, regexp2 %v", s, g, w)
			}
		}
		if g, w := pieces(fused, s), pieces(slow, s); !slices.Equal(g, w) {
			t.Fatalf("on %q: fused %q, regexp2 %q", s, g, w)
		}
	})
}

func TestAllowSpecialAndStrip(t *testing.T) {
	tok := loadMergeTokenizer(t)
	s, _ := tok.TokenID("<s>")
	tool, _ := tok.TokenID("<tool>")
	if got := tok.Encode("a<s>b<tool>", EncodeOptions{AllowSpecial: true}); !slices.Equal(got, []int{'a', s, 'b', tool}) {
		t.Errorf("AllowSpecial: %v", got)
	}
	if got := tok.Encode("<s>", EncodeOptions{}); slices.Contains(got, s) {
		t.Errorf("special token from plain text: %v", got)
	}
	strip, err := Load(mergeTokenizerJSON(nil, dsv3PreTokJSON()), nil,
		AddedToken{ID: 300, Content: "<L>", LStrip: true}, AddedToken{ID: 301, Content: "<R>", RStrip: true},
		AddedToken{ID: 302, Content: "<W>", SingleWord: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		text string
		want []int
	}{
		{"a  <L>b", []int{'a', 300, 'b'}},
		{"a<R>  b", []int{'a', 301, 'b'}},
		{"x <W> y", []int{'x', ' ', 302, ' ', 'y'}},
		{"x<W>y", []int{'x', '<', 'W', '>', 'y'}},
	} {
		if got := strip.Encode(c.text, EncodeOptions{AllowSpecial: true}); !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
}

func TestAddedLeftmostLongest(t *testing.T) {
	tok, err := Load(mergeTokenizerJSON(nil, dsv3PreTokJSON()), nil,
		AddedToken{ID: 300, Content: "<a>"}, AddedToken{ID: 301, Content: "<a>b"}, AddedToken{ID: 302, Content: "a>"},
		AddedToken{ID: 303, Content: "<a>bcd"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		text string
		want []int
	}{
		{"x<a>bc", []int{'x', 301, 'c'}},      // longest at the leftmost position
		{"<a>", []int{300}},                   // a prefix of longer tokens
		{"<a>bcd", []int{303}},                // the longest of three nested
		{"a>b<a>", []int{302, 'b', 300}},      // leftmost wins
		{"<<a>b", []int{'<', 301}},            // retry after a failed start
		{"<a>bc<a>bcd", []int{301, 'c', 303}}, // partial walk then full
	} {
		if got := tok.Encode(c.text, EncodeOptions{AllowSpecial: true}); !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
}

func TestDecoderStreaming(t *testing.T) {
	tok, err := Load(tinyTokenizerJSON(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"héllo 中文 😀!", "<think>x</think>", "a\u0301"} {
		d := tok.NewDecoder()
		var b strings.Builder
		for _, id := range tok.Encode(s, EncodeOptions{AllowSpecial: true}) {
			chunk := d.Add(id)
			if !utf8.ValidString(chunk) {
				t.Fatalf("chunk %q is not valid UTF-8", chunk)
			}
			b.WriteString(chunk)
		}
		b.WriteString(d.Flush())
		if b.String() != s {
			t.Errorf("stream decode = %q, want %q", b.String(), s)
		}
	}
	// Held back until complete; then never-valid bytes become U+FFFD.
	d := tok.NewDecoder()
	if got := d.Add(3 + 0xE4); got != "" {
		t.Errorf("first byte of 中 emitted %q", got)
	}
	if got := d.Add(3 + 0xB8); got != "" {
		t.Errorf("second byte of 中 emitted %q", got)
	}
	if got := d.Add(3 + 0xAD); got != "中" {
		t.Errorf("third byte gave %q, want 中", got)
	}
	if got := d.Add(3 + 0xFF); got != "\uFFFD" {
		t.Errorf("0xFF gave %q", got)
	}
	d.Add(3 + 0xE4)
	if got := d.Add(3 + 'a'); got != "\uFFFDa" {
		t.Errorf("broken sequence gave %q", got)
	}
	d.Add(3 + 0xF0)
	if got := d.Flush(); got != "\uFFFD" {
		t.Errorf("Flush of incomplete = %q", got)
	}
	if got := d.Flush(); got != "" {
		t.Errorf("second Flush = %q", got)
	}
	if got := tok.Decode([]int{-1, 99999}); got != "\uFFFD\uFFFD" {
		t.Errorf("Decode of unknown ids = %q", got)
	}
}

func TestLoadErrors(t *testing.T) {
	good := string(mergeTokenizerJSON([][2]string{{"a", "b"}}, dsv3PreTokJSON()))
	tests := []struct {
		name, json, config, wantErr string
	}{
		{"not json", "{", "", "tokenizer.json"},
		{"no model", `{"pre_tokenizer":{"type":"ByteLevel"},"decoder":{"type":"ByteLevel"}}`, "", "model: missing"},
		{"wordpiece", strings.Replace(good, `"type":"BPE"`, `"type":"WordPiece"`, 1), "", "model.type"},
		{"bad merge", strings.Replace(good, `"a b"`, `"a zz"`, 1), "", "model.merges[0]"},
		{"merge three parts", strings.Replace(good, `"a b"`, `"a b c"`, 1), "", "model.merges[0]"},
		{"bad regex", strings.Replace(good, `\\p{N}{1,3}`, `(`, 1), "", "pre_tokenizer.pretokenizers[0].pattern.Regex"},
		{"bad behavior", strings.Replace(good, `"Isolated"`, `"Sideways"`, 1), "", "pre_tokenizer.pretokenizers[0].behavior"},
		{"unknown pretok", strings.Replace(good, `"type":"Split"`, `"type":"Metaspace"`, 1), "", "pre_tokenizer.pretokenizers[0].type"},
		{"no bytelevel", strings.Replace(good, `"type":"ByteLevel","use_regex"`, `"type":"Digits","use_regex"`, 1), "", "no ByteLevel"},
		{"nfc", strings.Replace(good, `"normalizers":[]`, `"normalizers":[{"type":"NFC"}]`, 1), "", "normalizer.normalizers[0].type"},
		{"decoder", strings.Replace(good, `"decoder":{"type":"ByteLevel"}`, `"decoder":{"type":"WordPiece"}`, 1), "", "decoder.type"},
		{"negative id", strings.Replace(good, `"a":`, `"a":-5,"x":`, 1), "", "model.vocab"},
		{"huge id", strings.Replace(good, `"a":`, `"a":999999999,"x":`, 1), "", "out of range"},
		{"missing byte token", strings.Replace(good, `"a":`, `"zzz":`, 1), "", "no token for byte 0x61"},
		{"added no content", strings.Replace(good, `"content":"<s>",`, ``, 1), "", "added_tokens[0]"},
		{"added dup content", strings.Replace(good, `"content":"<tool>"`, `"content":"<s>"`, 1), "", "added_tokens[1]"},
		{"bos unknown", good, `{"bos_token":"<nope>"}`, "tokenizer_config.json: bos_token"},
		{"bos bad type", good, `{"bos_token":5}`, "tokenizer_config.json: bos_token"},
		{"add_bos without bos", good, `{"add_bos_token":true}`, "add_bos_token"},
		{"config not json", good, `[`, "tokenizer_config.json"},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load([]byte(c.json), []byte(c.config))
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("err = %v, want it to mention %q", err, c.wantErr)
			}
		})
	}
	if _, err := Load([]byte(good), nil, AddedToken{ID: 0, Content: "<other>"}); err == nil {
		t.Error("extra token reusing a vocabulary id was accepted")
	}
}

func FuzzLoad(f *testing.F) {
	f.Add(tinyTokenizerJSON(), []byte(tinyConfigJSON))
	f.Add(mergeTokenizerJSON(englishMerges, dsv3PreTokJSON()), []byte(`{"bos_token":"<s>","add_bos_token":true}`))
	f.Add([]byte(`{"model":{"vocab":{"a":0},"merges":[["a","a"]]},"pre_tokenizer":{"type":"ByteLevel"},"decoder":{"type":"ByteLevel"}}`), []byte(nil))
	f.Fuzz(func(t *testing.T, tj, cj []byte) {
		tok, err := Load(tj, cj)
		if err != nil {
			return
		}
		ids := tok.Encode("Hello, wörld 123 <s>\n", EncodeOptions{AllowSpecial: true, AddSpecialTokens: true})
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() {
				t.Fatalf("id %d outside [0, %d)", id, tok.VocabSize())
			}
		}
		_ = tok.Decode(ids)
	})
}

func FuzzEncodeRoundTrip(f *testing.F) {
	for _, s := range dsv3Cases {
		f.Add(s)
	}
	tok, err := Load(mergeTokenizerJSON(englishMerges, dsv3PreTokJSON()), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for _, allow := range []bool{false, true} {
			if got := tok.Decode(tok.Encode(s, EncodeOptions{AllowSpecial: allow})); got != s {
				t.Fatalf("Decode(Encode(%q)) = %q (AllowSpecial %v)", s, got, allow)
			}
		}
	})
}

// englishText returns prose for the benchmark: the Go memory model and
// specification shipped with the Go toolchain, with HTML tags removed.
func englishText(b *testing.B) string {
	root := os.Getenv("GOROOT")
	if root == "" {
		root = filepath.Join(filepath.Dir(os.Args[0]), "nonexistent")
		if out, err := goEnvGOROOT(); err == nil {
			root = out
		}
	}
	var sb strings.Builder
	for _, f := range []string{"go_mem.html", "go_spec.html"} {
		data, err := os.ReadFile(filepath.Join(root, "doc", f))
		if err != nil {
			b.Skipf("benchmark text not found: %v", err)
		}
		sb.Write(data)
	}
	text := regexp.MustCompile(`<[^>]*>`).ReplaceAllString(sb.String(), "")
	text = strings.NewReplacer("&lt;", "<", "&gt;", ">", "&amp;", "&", "&quot;", `"`).Replace(text)
	return text
}

func BenchmarkEncodeEnglish(b *testing.B) {
	tok := loadV3(b)
	text := englishText(b)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	cpu0, n := cputime.Process(), 0
	for b.Loop() {
		tok.Encode(text, EncodeOptions{})
		n++
	}
	reportCPUThroughput(b, cpu0, n*len(text))
}

// reportCPUThroughput adds MB per CPU-second (all threads of the process,
// GC included) as a metric that contention on the machine does not skew.
func reportCPUThroughput(b *testing.B, cpu0 time.Duration, bytes int) {
	if d := cputime.Process() - cpu0; d > 0 {
		b.ReportMetric(float64(bytes)/1e6/d.Seconds(), "MB/cpu-s")
	}
}

// BenchmarkEncodeEnglishCold empties the piece cache before every pass.
func BenchmarkEncodeEnglishCold(b *testing.B) {
	tok := loadV3(b)
	text := englishText(b)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	cpu0, n := cputime.Process(), 0
	for b.Loop() {
		tok.bpe.mu.Lock()
		clear(tok.bpe.cache)
		clear(tok.bpe.small)
		tok.bpe.mu.Unlock()
		tok.Encode(text, EncodeOptions{})
		n++
	}
	reportCPUThroughput(b, cpu0, n*len(text))
}

func BenchmarkPreTokenizeDSV3(b *testing.B) {
	text := englishText(b)
	for _, c := range []struct {
		name string
		m    matcher
	}{
		{"scanner", fastMatcher(dsv3MainPattern)},
		{"regexp2", &regexMatcher{re: regexp2.MustCompile(dsv3MainPattern, regexp2.None)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			cpu0, k := cputime.Process(), 0
			for b.Loop() {
				n := 0
				c.m.eachMatch(text, func(int, int) { n++ })
				k++
			}
			reportCPUThroughput(b, cpu0, k*len(text))
		})
	}
}

func BenchmarkLoadV3(b *testing.B) {
	tj, err := os.ReadFile(filepath.Join(npmModelDir, "tokenizer.json"))
	if err != nil {
		b.Skipf("DeepSeek-V3 tokenizer.json not installed (run scripts/test-setup.sh): %v", err)
	}
	b.SetBytes(int64(len(tj)))
	for b.Loop() {
		if _, err := Load(tj, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func TestMergesPairForm(t *testing.T) {
	str := string(mergeTokenizerJSON(englishMerges, dsv3PreTokJSON()))
	// Rewrite every "a b" merge as ["a", "b"] (no token contains a space in
	// the byte-level alphabet).
	i := strings.Index(str, `"merges":[`) + len(`"merges":[`)
	j := i + strings.Index(str[i:], "]")
	var merges []string
	if err := json.Unmarshal([]byte("["+str[i:j]+"]"), &merges); err != nil {
		t.Fatal(err)
	}
	var pairs [][]string
	for _, m := range merges {
		pairs = append(pairs, strings.SplitN(m, " ", 2))
	}
	pj, _ := json.Marshal(pairs)
	pairForm := str[:i-1] + string(pj) + str[j+1:]
	a, err := Load([]byte(str), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Load([]byte(pairForm), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(dsv3Cases, "the theater and thing", strings.Repeat("a", 70)) {
		if x, y := a.Encode(s, EncodeOptions{}), b.Encode(s, EncodeOptions{}); !slices.Equal(x, y) {
			t.Errorf("%q: string form %v, pair form %v", s, x, y)
		}
	}
	mixed := str[:i] + `["t","h"],` + str[i:]
	if _, err := Load([]byte(mixed), nil); err == nil || !strings.Contains(err.Error(), "model.merges") {
		t.Errorf("mixed merges: err = %v", err)
	}
}

// BenchmarkEncodeHTMLAllowSpecial encodes markup (many '<', the first byte of
// most added tokens) with added-token matching on.
func BenchmarkEncodeHTMLAllowSpecial(b *testing.B) {
	tok := loadV3(b, DeepSeekV4AddedTokens()...)
	root, err := goEnvGOROOT()
	if err != nil {
		b.Skip(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "doc", "go_spec.html"))
	if err != nil {
		b.Skip(err)
	}
	text := string(data)
	b.SetBytes(int64(len(text)))
	cpu0, n := cputime.Process(), 0
	for b.Loop() {
		tok.Encode(text, EncodeOptions{AllowSpecial: true})
		n++
	}
	reportCPUThroughput(b, cpu0, n*len(text))
}

func TestByteLevelOptions(t *testing.T) {
	for _, c := range []struct {
		json string
		in   string
		want []string
	}{
		// GPT-2's split, with HF's lookahead rule for runs of spaces.
		{`{"type":"ByteLevel","add_prefix_space":false}`, "Hello world's  test", []string{"Hello", " world", "'s", " ", " test"}},
		{`{"type":"ByteLevel","add_prefix_space":true,"use_regex":false}`, "hi there", []string{" hi there"}},
		{`{"type":"ByteLevel","add_prefix_space":true,"use_regex":false}`, " hi", []string{" hi"}},
		{`{"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},{"type":"ByteLevel","use_regex":false}]}`, "a12b", []string{"a", "1", "2", "b"}},
		{`{"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":false},{"type":"ByteLevel","use_regex":false}]}`, "a12b", []string{"a", "12", "b"}},
		{`{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"String":"-"},"behavior":"MergedWithNext","invert":false},{"type":"ByteLevel","use_regex":false}]}`, "a-b-c", []string{"a", "-b", "-c"}},
	} {
		pre, hasBL, err := parsePreTokenizer([]byte(c.json), "pre_tokenizer")
		if err != nil || !hasBL {
			t.Fatalf("%s: %v (ByteLevel %v)", c.json, err, hasBL)
		}
		if got := pieces(pre, c.in); !slices.Equal(got, c.want) {
			t.Errorf("%s on %q: %q, want %q", c.json, c.in, got, c.want)
		}
	}
}

func TestNormalizers(t *testing.T) {
	for _, c := range []struct{ json, in, want string }{
		{`{"type":"Lowercase"}`, "AbC", "abc"},
		{`{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]}`, "a b", "▁a▁b"},
		{`{"type":"Replace","pattern":{"Regex":"\\s+"},"content":" "}`, "a \t\n b", "a b"},
		{`{"type":"Strip","strip_left":true,"strip_right":false}`, "  a  ", "a  "},
	} {
		n, err := parseNormalizer([]byte(c.json), "normalizer")
		if err != nil {
			t.Fatalf("%s: %v", c.json, err)
		}
		if got := n.normalize(c.in); got != c.want {
			t.Errorf("%s on %q: %q, want %q", c.json, c.in, got, c.want)
		}
	}
}

func TestConcurrentEncode(t *testing.T) {
	tok := loadMergeTokenizer(t)
	texts := append([]string(nil), dsv3Cases...)
	want := make([][]int, len(texts))
	for i, s := range texts {
		want[i] = tok.Encode(s, EncodeOptions{AllowSpecial: true})
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < 20; r++ {
				for i, s := range texts {
					if got := tok.Encode(s, EncodeOptions{AllowSpecial: true}); !slices.Equal(got, want[i]) {
						errs <- fmt.Sprintf("%q: %v, want %v", s, got, want[i])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestEncodeSegments(t *testing.T) {
	tok := loadMergeTokenizer(t)
	s, _ := tok.TokenID("<s>")
	tool, _ := tok.TokenID("<tool>")
	for _, c := range []struct {
		name string
		segs []Segment
		want []int // nil: equal to Encode of the concatenation with AllowSpecial
	}{
		{"same as Encode", []Segment{{"a <s>", true}, {" the end", false}, {"<tool>\n\n", true}, {"\n x", false}}, nil},
		{"merges across boundary", []Segment{{"th", false}, {"e", true}}, nil},
		{"plain segment keeps token text", []Segment{{"<s>", false}}, []int{'<', 's', '>'}},
		{"no match across boundary", []Segment{{"<s", true}, {">", true}}, []int{'<', 's', '>'}},
		{"mixed", []Segment{{"<tool>", true}, {"<tool>", false}, {"<s>", true}}, []int{tool, '<', 't', 'o', 'o', 'l', '>', s}},
		{"empty", nil, []int{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := c.want
			if want == nil {
				var all strings.Builder
				for _, sg := range c.segs {
					all.WriteString(sg.Text)
				}
				want = tok.Encode(all.String(), EncodeOptions{AllowSpecial: true})
			}
			if got := tok.EncodeSegments(c.segs); !slices.Equal(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}
