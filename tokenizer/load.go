package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/dlclark/regexp2/v2"
)

// MaxID bounds token ids accepted from tokenizer.json (a guard against
// hostile files allocating huge tables).
const MaxID = 1 << 22

type fileJSON struct {
	AddedTokens  []addedJSON     `json:"added_tokens"`
	Normalizer   json.RawMessage `json:"normalizer"`
	PreTokenizer json.RawMessage `json:"pre_tokenizer"`
	Decoder      json.RawMessage `json:"decoder"`
	Model        *modelJSON      `json:"model"`
}

type addedJSON struct {
	ID         *int    `json:"id"`
	Content    *string `json:"content"`
	Special    bool    `json:"special"`
	LStrip     bool    `json:"lstrip"`
	RStrip     bool    `json:"rstrip"`
	SingleWord bool    `json:"single_word"`
}

type modelJSON struct {
	Type                    string          `json:"type"`
	Vocab                   map[string]int  `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
}

type configJSON struct {
	BOSToken    json.RawMessage `json:"bos_token"`
	EOSToken    json.RawMessage `json:"eos_token"`
	AddBOSToken *bool           `json:"add_bos_token"`
	AddEOSToken *bool           `json:"add_eos_token"`
}

// Load builds a Tokenizer from the bytes of tokenizer.json and
// tokenizer_config.json (the latter may be nil: no BOS/EOS are then known).
// extra adds tokens that the file lacks (for example DeepSeek-V4's
// `<think>` on top of the V3 file, see DeepSeekV4AddedTokens); an extra
// token whose id and content are already present is accepted, one that
// conflicts with an existing id or content is an error.
//
// Supported: model BPE over the byte-level alphabet (vocab; merges as "a b"
// strings or ["a","b"] pairs; unk_token; ignore_merges); normalizer null or
// Sequence/Lowercase/Prepend/Replace/Strip; pre_tokenizer Sequence/Split/
// ByteLevel/Digits, which must include ByteLevel; decoder ByteLevel.
// Errors name the tokenizer.json field at fault. The normalized flag of added
// tokens is ignored: they are matched in the raw text.
func Load(tokenizerJSON, tokenizerConfigJSON []byte, extra ...AddedToken) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if f.Model == nil {
		return nil, fmt.Errorf("tokenizer.json: model: missing")
	}
	m := f.Model
	if m.Type != "" && m.Type != "BPE" {
		return nil, fmt.Errorf("tokenizer.json: model.type: %q is not supported (only BPE)", m.Type)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return nil, fmt.Errorf("tokenizer.json: model.dropout: %v is not supported (need null)", *m.Dropout)
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" {
		return nil, fmt.Errorf("tokenizer.json: model.continuing_subword_prefix: not supported (need null)")
	}
	if m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return nil, fmt.Errorf("tokenizer.json: model.end_of_word_suffix: not supported (need null)")
	}
	if m.ByteFallback {
		return nil, fmt.Errorf("tokenizer.json: model.byte_fallback: true is not supported with byte-level BPE")
	}
	if len(m.Vocab) == 0 {
		return nil, fmt.Errorf("tokenizer.json: model.vocab: missing or empty")
	}

	pre, hasByteLevel, err := parsePreTokenizer(f.PreTokenizer, "pre_tokenizer")
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if !hasByteLevel {
		return nil, fmt.Errorf("tokenizer.json: pre_tokenizer: no ByteLevel step; only byte-level BPE is supported")
	}
	if err := checkDecoder(f.Decoder, "decoder"); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	norm, err := parseNormalizer(f.Normalizer, "normalizer")
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}

	_, dec := byteLevelAlphabet()
	t := &Tokenizer{
		normalize: norm,
		pretok:    fuseDSV3(pre),
		byStr:     make(map[string]int, len(m.Vocab)+len(f.AddedTokens)),
		bos:       -1,
		eos:       -1,
	}
	b := &bpeModel{
		vocab:        make(map[string]int32, len(m.Vocab)),
		merges:       make(map[uint64]merge),
		unk:          -1,
		ignoreMerges: m.IgnoreMerges,
		cache:        make(map[string][]int32),
		small:        make(map[uint64][]int32),
	}
	for i := range b.byteID {
		b.byteID[i] = -1
	}
	t.bpe = b

	// Vocabulary. Sorted keys make the duplicate-id error deterministic.
	keys := make([]string, 0, len(m.Vocab))
	maxID := -1
	for k, id := range m.Vocab {
		if id < 0 || id >= MaxID {
			return nil, fmt.Errorf("tokenizer.json: model.vocab[%q]: id %d out of range [0, %d)", k, id, MaxID)
		}
		keys = append(keys, k)
		maxID = max(maxID, id)
	}
	sort.Strings(keys)
	for _, a := range f.AddedTokens {
		if a.ID != nil {
			maxID = max(maxID, *a.ID)
		}
	}
	for _, a := range extra {
		maxID = max(maxID, a.ID)
	}
	if maxID >= MaxID {
		maxID = MaxID - 1 // reported precisely below
	}
	t.idBytes = make([]string, maxID+1)
	t.known = make([]bool, maxID+1)
	owner := make([]string, maxID+1)
	for _, k := range keys {
		id := m.Vocab[k]
		if t.known[id] {
			return nil, fmt.Errorf("tokenizer.json: model.vocab: id %d used by both %q and %q", id, owner[id], k)
		}
		t.known[id], owner[id] = true, k
		t.byStr[k] = id
		if raw, ok := byteLevelDecode(k, dec); ok {
			t.idBytes[id] = raw
			b.vocab[raw] = int32(id)
			if len(raw) == 1 {
				b.byteID[raw[0]] = int32(id)
			}
		} else {
			t.idBytes[id] = k
		}
	}
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("tokenizer.json: model.unk_token: %q is not in model.vocab", *m.UnkToken)
		}
		b.unk = int32(id)
	}

	if b.unk < 0 {
		enc, _ := byteLevelAlphabet()
		for c, id := range b.byteID {
			if id < 0 {
				return nil, fmt.Errorf("tokenizer.json: model.vocab: no token for byte %#02x (%q) and no unk_token: some text could not be encoded", c, string(enc[c]))
			}
		}
	}

	if err := parseMerges(m.Merges, m.Vocab, dec, b); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}

	// Added tokens.
	all := make([]AddedToken, 0, len(f.AddedTokens)+len(extra))
	for i, a := range f.AddedTokens {
		if a.ID == nil || a.Content == nil {
			return nil, fmt.Errorf("tokenizer.json: added_tokens[%d]: id and content are required", i)
		}
		all = append(all, AddedToken{ID: *a.ID, Content: *a.Content, Special: a.Special, LStrip: a.LStrip, RStrip: a.RStrip, SingleWord: a.SingleWord})
	}
	nFile := len(all)
	all = append(all, extra...)
	byContent := make(map[string]int)
	byID := make(map[int]string)
	for i, a := range all {
		field := fmt.Sprintf("tokenizer.json: added_tokens[%d]", i)
		if i >= nFile {
			field = fmt.Sprintf("extra added token %d (%q)", i-nFile, a.Content)
		}
		if a.ID < 0 || a.ID >= MaxID {
			return nil, fmt.Errorf("%s: id %d out of range [0, %d)", field, a.ID, MaxID)
		}
		if a.Content == "" {
			return nil, fmt.Errorf("%s: empty content", field)
		}
		if c, dup := byID[a.ID]; dup {
			if c == a.Content {
				continue
			}
			return nil, fmt.Errorf("%s: id %d already names added token %q", field, a.ID, c)
		}
		if id, dup := byContent[a.Content]; dup {
			return nil, fmt.Errorf("%s: content %q already has id %d", field, a.Content, id)
		}
		if t.known[a.ID] && owner[a.ID] != a.Content && i >= nFile {
			return nil, fmt.Errorf("%s: id %d is the vocabulary token %q", field, a.ID, owner[a.ID])
		}
		byID[a.ID], byContent[a.Content] = a.Content, a.ID
		t.known[a.ID] = true
		t.idBytes[a.ID] = a.Content
		t.byStr[a.Content] = a.ID
		t.added = append(t.added, a)
	}
	sort.Slice(t.added, func(i, j int) bool { return t.added[i].ID < t.added[j].ID })
	t.special = make([]bool, len(t.idBytes))
	for i, a := range t.added {
		t.special[a.ID] = a.Special
		t.trie.insert(a.Content, i)
	}

	if len(bytes.TrimSpace(tokenizerConfigJSON)) > 0 {
		if err := t.applyConfig(tokenizerConfigJSON); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// applyConfig reads tokenizer_config.json.
func (t *Tokenizer) applyConfig(data []byte) error {
	var c configJSON
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("tokenizer_config.json: %w", err)
	}
	var err error
	if t.bos, err = t.configToken(c.BOSToken, "bos_token"); err != nil {
		return err
	}
	if t.eos, err = t.configToken(c.EOSToken, "eos_token"); err != nil {
		return err
	}
	t.addBOS = c.AddBOSToken != nil && *c.AddBOSToken
	t.addEOS = c.AddEOSToken != nil && *c.AddEOSToken
	if t.addBOS && t.bos < 0 {
		return fmt.Errorf("tokenizer_config.json: add_bos_token is true but bos_token is not set")
	}
	if t.addEOS && t.eos < 0 {
		return fmt.Errorf("tokenizer_config.json: add_eos_token is true but eos_token is not set")
	}
	return nil
}

// configToken resolves a token given as a string or an AddedToken object
// ({"content": ...}); null or absent gives -1.
func (t *Tokenizer) configToken(raw json.RawMessage, field string) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return -1, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		var obj struct {
			Content *string `json:"content"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
			return -1, fmt.Errorf("tokenizer_config.json: %s: want a string or an object with \"content\"", field)
		}
		s = *obj.Content
	}
	id, ok := t.byStr[s]
	if !ok {
		return -1, fmt.Errorf("tokenizer_config.json: %s: %q is not a token of tokenizer.json", field, s)
	}
	return id, nil
}

func parseMerges(raw json.RawMessage, vocab map[string]int, dec map[rune]byte, b *bpeModel) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	// Either every entry is "a b" or every entry is ["a", "b"]; decode the
	// whole array at once in the first form, then the second, and only fall
	// back to entry-by-entry decoding to report which entry is bad.
	var pairs [][2]string
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		pairs = make([][2]string, len(strs))
		for i, s := range strs {
			l, r, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(r, " ") {
				return fmt.Errorf("model.merges[%d]: %q is not two tokens separated by one space", i, s)
			}
			pairs[i] = [2]string{l, r}
		}
	} else {
		var lists [][]string
		if err := json.Unmarshal(raw, &lists); err != nil {
			var items []json.RawMessage
			if err := json.Unmarshal(raw, &items); err != nil {
				return fmt.Errorf("model.merges: want an array: %w", err)
			}
			for i, it := range items {
				var s string
				var l []string
				if json.Unmarshal(it, &s) != nil && (json.Unmarshal(it, &l) != nil || len(l) != 2) {
					return fmt.Errorf("model.merges[%d]: want \"a b\" or [\"a\", \"b\"]", i)
				}
			}
			return fmt.Errorf("model.merges: mixes \"a b\" strings and [\"a\", \"b\"] pairs")
		}
		pairs = make([][2]string, len(lists))
		for i, l := range lists {
			if len(l) != 2 {
				return fmt.Errorf("model.merges[%d]: want [\"a\", \"b\"], got %d strings", i, len(l))
			}
			pairs[i] = [2]string{l[0], l[1]}
		}
	}
	for i, pr := range pairs {
		l, r := pr[0], pr[1]
		li, ok1 := vocab[l]
		ri, ok2 := vocab[r]
		mi, ok3 := vocab[l+r]
		switch {
		case !ok1:
			return fmt.Errorf("model.merges[%d]: %q is not in model.vocab", i, l)
		case !ok2:
			return fmt.Errorf("model.merges[%d]: %q is not in model.vocab", i, r)
		case !ok3:
			return fmt.Errorf("model.merges[%d]: merged token %q is not in model.vocab", i, l+r)
		}
		if _, ok := byteLevelDecode(l+r, dec); !ok {
			continue // unreachable from bytes
		}
		k := pairKey(int32(li), int32(ri))
		if _, dup := b.merges[k]; !dup { // the first (highest-priority) entry wins
			b.merges[k] = merge{rank: int32(i), id: int32(mi)}
		}
	}
	return nil
}

type typed struct {
	Type string `json:"type"`
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// parsePreTokenizer returns the pre-tokenizer at path and whether it holds a
// ByteLevel step.
func parsePreTokenizer(raw json.RawMessage, path string) (preTokenizer, bool, error) {
	if isNull(raw) {
		return sequence(nil), false, nil
	}
	var ty typed
	if err := json.Unmarshal(raw, &ty); err != nil {
		return nil, false, fmt.Errorf("%s: %w", path, err)
	}
	switch ty.Type {
	case "Sequence":
		var s struct {
			Pretokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, false, fmt.Errorf("%s.pretokenizers: %w", path, err)
		}
		var seq sequence
		bl := false
		for i, p := range s.Pretokenizers {
			if isNull(p) {
				return nil, false, fmt.Errorf("%s.pretokenizers[%d]: null", path, i)
			}
			step, hasBL, err := parsePreTokenizer(p, fmt.Sprintf("%s.pretokenizers[%d]", path, i))
			if err != nil {
				return nil, false, err
			}
			bl = bl || hasBL
			seq = append(seq, step)
		}
		return seq, bl, nil
	case "Split":
		var s struct {
			Pattern struct {
				Regex  *string `json:"Regex"`
				String *string `json:"String"`
			} `json:"pattern"`
			Behavior string `json:"behavior"`
			Invert   bool   `json:"invert"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, false, fmt.Errorf("%s: %w", path, err)
		}
		beh, ok := behaviorNames[s.Behavior]
		if !ok {
			return nil, false, fmt.Errorf("%s.behavior: %q is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous", path, s.Behavior)
		}
		var m matcher
		switch {
		case s.Pattern.Regex != nil:
			m, err := compilePattern(*s.Pattern.Regex, path+".pattern.Regex")
			if err != nil {
				return nil, false, err
			}
			return &splitStep{m: m, behavior: beh, invert: s.Invert}, false, nil
		case s.Pattern.String != nil:
			if *s.Pattern.String == "" {
				return nil, false, fmt.Errorf("%s.pattern.String: empty", path)
			}
			m = literalMatcher{*s.Pattern.String}
		default:
			return nil, false, fmt.Errorf("%s.pattern: want {\"Regex\": ...} or {\"String\": ...}", path)
		}
		return &splitStep{m: m, behavior: beh, invert: s.Invert}, false, nil
	case "ByteLevel":
		s := struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}{}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, false, fmt.Errorf("%s: %w", path, err)
		}
		st := &byteLevelStep{addPrefixSpace: s.AddPrefixSpace}
		if s.UseRegex == nil || *s.UseRegex { // HF's default is true
			m, err := compilePattern(gpt2Pattern, path+".use_regex")
			if err != nil {
				return nil, false, err
			}
			st.re = m
		}
		return st, true, nil
	case "Digits":
		var s struct {
			IndividualDigits bool `json:"individual_digits"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, false, fmt.Errorf("%s: %w", path, err)
		}
		m := runMatcher{pred: isNumeric}
		if s.IndividualDigits {
			m.max = 1
		}
		return &splitStep{m: m, behavior: behIsolated}, false, nil
	}
	return nil, false, fmt.Errorf("%s.type: %q is not supported (Sequence, Split, ByteLevel, Digits)", path, ty.Type)
}

func compilePattern(p, path string) (matcher, error) {
	if m := fastMatcher(p); m != nil {
		return m, nil
	}
	re, err := regexp2.Compile(p, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &regexMatcher{re: re}, nil
}

func checkDecoder(raw json.RawMessage, path string) error {
	if isNull(raw) {
		return fmt.Errorf("%s: missing; byte-level BPE needs a ByteLevel decoder", path)
	}
	var ty typed
	if err := json.Unmarshal(raw, &ty); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	switch ty.Type {
	case "ByteLevel":
		return nil
	case "Sequence":
		var s struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("%s.decoders: %w", path, err)
		}
		if len(s.Decoders) == 1 {
			return checkDecoder(s.Decoders[0], path+".decoders[0]")
		}
	}
	return fmt.Errorf("%s.type: %q is not supported (need ByteLevel)", path, ty.Type)
}
