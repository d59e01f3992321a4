package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"github.com/dlclark/regexp2/v2"
)

// normalizer rewrites text before pre-tokenization.
type normalizer interface {
	normalize(s string) string
}

func isNumeric(r rune) bool { return unicode.IsNumber(r) }

type normSeq []normalizer

func (q normSeq) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

type normLower struct{}

func (normLower) normalize(s string) string { return strings.ToLower(s) }

type normPrepend struct{ p string }

func (n normPrepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.p + s
}

type normStrip struct{ left, right bool }

func (n normStrip) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

type normReplace struct {
	lit     string
	re      *regexp2.Regexp
	content string
}

func (n normReplace) normalize(s string) string {
	if n.re == nil {
		return strings.ReplaceAll(s, n.lit, n.content)
	}
	out, err := n.re.ReplaceFunc(s, func(regexp2.Match) string { return n.content }, -1, -1)
	if err != nil {
		return s
	}
	return out
}

// parseNormalizer returns nil for a null normalizer or an empty Sequence.
func parseNormalizer(raw json.RawMessage, path string) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var ty typed
	if err := json.Unmarshal(raw, &ty); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch ty.Type {
	case "Sequence":
		var s struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%s.normalizers: %w", path, err)
		}
		var q normSeq
		for i, r := range s.Normalizers {
			n, err := parseNormalizer(r, fmt.Sprintf("%s.normalizers[%d]", path, i))
			if err != nil {
				return nil, err
			}
			if n != nil {
				q = append(q, n)
			}
		}
		if len(q) == 0 {
			return nil, nil
		}
		return q, nil
	case "Lowercase":
		return normLower{}, nil
	case "Prepend":
		var s struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return normPrepend{s.Prepend}, nil
	case "Strip":
		var s struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return normStrip{s.Left, s.Right}, nil
	case "Replace":
		var s struct {
			Pattern struct {
				Regex  *string `json:"Regex"`
				String *string `json:"String"`
			} `json:"pattern"`
			Content string `json:"content"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		switch {
		case s.Pattern.Regex != nil:
			re, err := regexp2.Compile(*s.Pattern.Regex, regexp2.None)
			if err != nil {
				return nil, fmt.Errorf("%s.pattern.Regex: %w", path, err)
			}
			return normReplace{re: re, content: s.Content}, nil
		case s.Pattern.String != nil && *s.Pattern.String != "":
			return normReplace{lit: *s.Pattern.String, content: s.Content}, nil
		}
		return nil, fmt.Errorf("%s.pattern: want a non-empty {\"String\": ...} or {\"Regex\": ...}", path)
	}
	return nil, fmt.Errorf("%s.type: %q is not supported (Sequence, Lowercase, Prepend, Strip, Replace)", path, ty.Type)
}
