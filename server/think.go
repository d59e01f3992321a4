package server

import "strings"

// endThink is the marker between reasoning and the answer in DeepSeek-V4's
// thinking mode (a single special token, decoded to this text).
const endThink = "</think>"

// thinkSplitter routes streamed text to reasoning until </think> appears and
// to content after it. It holds back only a tail that could still be the
// start of </think>; the marker itself is dropped.
type thinkSplitter struct {
	reasoning bool // still before </think>
	pending   string
}

// push consumes s and returns the reasoning and content text now final.
func (t *thinkSplitter) push(s string) (reasoning, content string) {
	if !t.reasoning {
		return "", s
	}
	buf := t.pending + s
	t.pending = ""
	if i := strings.Index(buf, endThink); i >= 0 {
		t.reasoning = false
		return buf[:i], buf[i+len(endThink):]
	}
	for n := min(len(endThink)-1, len(buf)); n > 0; n-- {
		if strings.HasSuffix(buf, endThink[:n]) {
			t.pending = buf[len(buf)-n:]
			return buf[:len(buf)-n], ""
		}
	}
	return buf, ""
}

// flush returns held-back text at the end of the stream (still reasoning: the
// model never closed its thinking).
func (t *thinkSplitter) flush() (reasoning, content string) {
	r := t.pending
	t.pending = ""
	return r, ""
}
