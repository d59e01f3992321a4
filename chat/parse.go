package chat

import (
	"errors"
	"fmt"
	"strings"
)

// toolCallsStart opens a DSML tool-call block in the model's output.
const toolCallsStart = "\n\n<" + DSML + "tool_calls"

// Delta is newly available output text, split by destination.
type Delta struct {
	Reasoning string // reasoning_content (thinking mode, before </think>)
	Content   string // the answer
}

// Parser splits an assistant turn, fed as a stream of text chunks, into
// reasoning, content and tool calls. In thinking mode everything before
// `</think>` is reasoning; content ends at EOS or at a DSML tool_calls block,
// which is collected and parsed by Finish. Text that may be the start of a
// marker is held back until it is decided, so deltas never contain marker
// fragments. A Parser is not safe for concurrent use.
type Parser struct {
	state   int
	pending string
	tools   strings.Builder
	err     error
}

const (
	stReasoning = iota
	stContent
	stTools
	stDone
)

// NewParser returns a parser for output generated after the assistant opener
// of Render: `<think>` in thinking mode, `</think>` in chat mode.
func NewParser(thinking bool) *Parser {
	if thinking {
		return &Parser{state: stReasoning}
	}
	return &Parser{state: stContent}
}

// Add consumes the next chunk and returns the text that is now certain.
func (p *Parser) Add(chunk string) Delta {
	var d Delta
	p.pending += chunk
	for {
		switch p.state {
		case stReasoning:
			if i := strings.Index(p.pending, ThinkEnd); i >= 0 {
				d.Reasoning += p.pending[:i]
				p.pending = p.pending[i+len(ThinkEnd):]
				p.state = stContent
				continue
			}
			n := len(p.pending) - heldBack(p.pending, ThinkEnd)
			d.Reasoning += p.pending[:n]
			p.pending = p.pending[n:]
			return d
		case stContent:
			ti := strings.Index(p.pending, toolCallsStart)
			ei := strings.Index(p.pending, EOS)
			switch {
			case ti >= 0 && (ei < 0 || ti < ei):
				d.Content += p.pending[:ti]
				p.tools.WriteString(p.pending[ti+len(toolCallsStart):])
				p.pending = ""
				p.state = stTools
				return d
			case ei >= 0:
				d.Content += p.pending[:ei]
				if rest := p.pending[ei+len(EOS):]; rest != "" && p.err == nil {
					p.err = fmt.Errorf("chat: %d bytes of output after EOS", len(rest))
				}
				p.pending = ""
				p.state = stDone
				return d
			}
			n := len(p.pending) - max(heldBack(p.pending, toolCallsStart), heldBack(p.pending, EOS))
			d.Content += p.pending[:n]
			p.pending = p.pending[n:]
			return d
		case stTools:
			p.tools.WriteString(p.pending)
			p.pending = ""
			return d
		default:
			if p.pending != "" && p.err == nil {
				p.err = fmt.Errorf("chat: %d bytes of output after EOS", len(p.pending))
			}
			p.pending = ""
			return d
		}
	}
}

// heldBack is the length of the longest suffix of s that is a proper prefix
// of marker.
func heldBack(s, marker string) int {
	for n := min(len(s), len(marker)-1); n > 0; n-- {
		if strings.HasSuffix(s, marker[:n]) {
			return n
		}
	}
	return 0
}

// ErrNoThinkEnd reports a thinking-mode turn that never closed its reasoning
// with </think> (for example, generation stopped at a token limit).
var ErrNoThinkEnd = errors.New("chat: reasoning not closed by </think>")

// Finish ends the stream. It returns the text held back, the tool calls of a
// DSML block, and an error for malformed tool calls, text after EOS, or
// (with the reasoning delivered all the same) ErrNoThinkEnd.
func (p *Parser) Finish() (Delta, []ToolCall, error) {
	var d Delta
	var calls []ToolCall
	err := p.err
	switch p.state {
	case stReasoning:
		d.Reasoning = p.pending
		if err == nil {
			err = ErrNoThinkEnd
		}
	case stContent:
		d.Content = p.pending
	case stTools:
		var perr error
		calls, perr = parseToolCalls(p.tools.String())
		if err == nil {
			err = perr
		}
	}
	p.pending = ""
	p.state = stDone
	return d, calls, err
}

// Parsed is an assistant turn split into its parts.
type Parsed struct {
	ReasoningContent string
	Content          string
	ToolCalls        []ToolCall
}

// ParseCompletion parses a whole assistant turn (the text after the opener,
// with or without the final EOS).
func ParseCompletion(text string, thinking bool) (Parsed, error) {
	p := NewParser(thinking)
	d := p.Add(text)
	rest, calls, err := p.Finish()
	return Parsed{
		ReasoningContent: d.Reasoning + rest.Reasoning,
		Content:          d.Content + rest.Content,
		ToolCalls:        calls,
	}, err
}

// parseToolCalls parses the body of a DSML tool_calls block (the text after
// "\n\n<｜DSML｜tool_calls"), up to and including its closing tag and an
// optional EOS. Arguments are rebuilt as a JSON object: string="true"
// parameters become JSON strings, others are inserted as the JSON text the
// model wrote.
func parseToolCalls(s string) ([]ToolCall, error) {
	const (
		invokeOpen  = "<" + DSML + "invoke name=\""
		invokeClose = "</" + DSML + "invoke>"
		paramOpen   = "<" + DSML + "parameter name=\""
		paramClose  = "</" + DSML + "parameter>"
		blockClose  = "</" + DSML + "tool_calls>"
	)
	bad := func(what string) ([]ToolCall, error) {
		near := s
		if len(near) > 40 {
			near = near[:40]
		}
		return nil, fmt.Errorf("chat: malformed DSML tool call: %s near %q", what, near)
	}
	cut := func(prefix string) bool {
		if strings.HasPrefix(s, prefix) {
			s = s[len(prefix):]
			return true
		}
		return false
	}
	upTo := func(sep string) (string, bool) {
		i := strings.Index(s, sep)
		if i < 0 {
			return "", false
		}
		v := s[:i]
		s = s[i+len(sep):]
		return v, true
	}
	if !cut(">\n") {
		return bad("expected \">\\n\" after tool_calls")
	}
	var calls []ToolCall
	for {
		if cut(blockClose) {
			break
		}
		if !cut(invokeOpen) {
			return bad("expected invoke or end of tool_calls")
		}
		name, ok := upTo("\">\n")
		if !ok {
			return bad("unterminated invoke name")
		}
		var args strings.Builder
		args.WriteByte('{')
		seen := map[string]bool{}
		for !cut(invokeClose) {
			if !cut(paramOpen) {
				return bad("expected parameter or end of invoke")
			}
			key, ok := upTo("\" string=\"")
			if !ok {
				return bad("unterminated parameter name")
			}
			var isStr bool
			switch {
			case cut("true\">"):
				isStr = true
			case cut("false\">"):
			default:
				return bad(`string must be "true" or "false"`)
			}
			val, ok := upTo(paramClose)
			if !ok {
				return bad("unterminated parameter value")
			}
			if !cut("\n") {
				return bad("expected newline after parameter")
			}
			if seen[key] {
				return bad("duplicate parameter " + key)
			}
			seen[key] = true
			if len(seen) > 1 {
				args.WriteString(", ")
			}
			pyString(key, &args)
			args.WriteString(": ")
			if isStr {
				pyString(val, &args)
			} else {
				args.WriteString(val)
			}
		}
		args.WriteByte('}')
		calls = append(calls, ToolCall{Type: "function", Function: FunctionCall{Name: name, Arguments: args.String()}})
		if !cut("\n") {
			return bad("expected newline after invoke")
		}
	}
	s = strings.TrimPrefix(s, EOS)
	if s != "" {
		return bad("text after tool_calls")
	}
	return calls, nil
}
