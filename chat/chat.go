// Package chat renders conversations in the DeepSeek-V4 chat format (the
// format of DeepSeek's encoding_dsv4, described in dsv4-flash.md §6) and
// parses the model's output back into reasoning, content and tool calls.
//
// Encode renders and tokenizes in one step, keeping control tokens out of
// message text. Render returns the same prompt as a string (for display,
// tests, or tokenizer.EncodeOptions{AllowSpecial: true} when the messages are
// trusted).
//
// Not supported: the reasoning_effort="max" instruction paragraph and the
// response_format schema section of DeepSeek's encoder (their fixed English
// texts are not part of the official test vectors, and third-party text is
// not copied into this repository).
package chat

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"moxie/tokenizer"
)

// Control tokens of the DeepSeek-V4 chat format.
const (
	BOS            = "<｜begin▁of▁sentence｜>"
	EOS            = "<｜end▁of▁sentence｜>"
	UserToken      = "<｜User｜>"
	AssistantToken = "<｜Assistant｜>"
	ThinkStart     = "<think>"
	ThinkEnd       = "</think>"
	DSML           = "｜DSML｜"
	ReminderToken  = "<｜latest_reminder｜>"
)

// taskTokens are the quick-instruction task markers.
var taskTokens = map[string]string{
	"action":    "<｜action｜>",
	"query":     "<｜query｜>",
	"authority": "<｜authority｜>",
	"domain":    "<｜domain｜>",
	"title":     "<｜title｜>",
	"read_url":  "<｜read_url｜>",
}

// Message is one conversation turn. JSON field names follow the OpenAI chat
// API (plus DeepSeek's reasoning_content, task and wo_eos), so a request body
// decodes into []Message directly.
type Message struct {
	// Role is system, user, assistant, tool, developer or latest_reminder.
	Role             string `json:"role"`
	Content          string `json:"content"`
	ReasoningContent string `json:"reasoning_content,omitempty"`
	// ToolCalls are the calls an assistant turn made.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID ties a tool message (a result) to the call it answers; tool
	// results are rendered in the order of the calls.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Tools declared on a system or developer message are described in the
	// prompt. Declaring tools anywhere keeps all reasoning (no drop).
	Tools []Tool `json:"tools,omitempty"`
	// Task names a quick-instruction task (action, query, authority, domain,
	// title, read_url) answered by the next assistant turn.
	Task string `json:"task,omitempty"`
	// WoEOS renders an assistant turn without the closing EOS (a prefix for
	// the model to continue).
	WoEOS bool `json:"wo_eos,omitempty"`
}

// ToolCall is an OpenAI-style function call.
type ToolCall struct {
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function FunctionCall `json:"function"`
}

// FunctionCall names a function and carries its arguments as JSON text (an
// object).
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Tool is an OpenAI-style tool declaration. Function (the object with name,
// description and parameters) is rendered into the prompt verbatim, in its
// key order.
type Tool struct {
	Type     string          `json:"type"`
	Function json.RawMessage `json:"function"`
}

// Options selects the rendering mode.
type Options struct {
	// Thinking selects thinking mode: the assistant opener is `<think>` and
	// finished turns carry their reasoning. Otherwise (chat mode) the opener
	// is `</think>` and no reasoning is rendered.
	Thinking bool
	// KeepThinking keeps the reasoning of assistant turns before the last user
	// message (drop_thinking=False). It is implied when any message declares
	// tools.
	KeepThinking bool
	// NoBOS leaves out the leading BOS (for a continuation of a prompt).
	NoBOS bool
}

// toolResult is a tool result merged into a user turn.
type block struct {
	text     string
	isResult bool
	callID   string
}

// turn is a message after tool results are merged into user turns.
type turn struct {
	Message
	blocks    []block
	hasBlocks bool
}

// Render returns the prompt for msgs. When the last message is a user (or
// developer) turn, the assistant opener for the next turn is appended, so the
// result is ready for generation. Errors name the message index at fault.
// Encoding the result with AllowSpecial treats control-token text inside
// message contents as control tokens; Encode does not.
func Render(msgs []Message, opts Options) (string, error) {
	segs, err := segments(msgs, opts)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, sg := range segs {
		b.WriteString(sg.Text)
	}
	return b.String(), nil
}

// Encode renders msgs as Render does and returns the token ids. Only the
// format's own markers become control tokens: text from the messages
// (contents, reasoning, tool names, arguments, schemas, results) is encoded
// as plain text even if it spells `<｜User｜>` or `</think>`. For messages
// without such text the ids equal
// tok.Encode(Render(msgs, opts), tokenizer.EncodeOptions{AllowSpecial: true}).
func Encode(tok *tokenizer.Tokenizer, msgs []Message, opts Options) ([]int, error) {
	segs, err := segments(msgs, opts)
	if err != nil {
		return nil, err
	}
	return tok.EncodeSegments(segs), nil
}

// SystemPrefix returns how many of ids, msgs encoded by Encode with opts,
// are the leading system messages alone (with their tools): the tokens
// that conversations with the same system prompt share whatever follows,
// where a prompt cache may keep a checkpoint. 0 when msgs do not start with
// a system message, or ids do not start with those messages' encoding and
// go on past it.
func SystemPrefix(tok *tokenizer.Tokenizer, msgs []Message, opts Options, ids []int) int {
	k := 0
	for k < len(msgs) && msgs[k].Role == "system" {
		k++
	}
	if k == 0 {
		return 0
	}
	pre, err := Encode(tok, msgs[:k], opts)
	if err != nil || len(pre) >= len(ids) || !slices.Equal(pre, ids[:len(pre)]) {
		return 0
	}
	return len(pre)
}

// segments renders msgs as template and message segments.
func segments(msgs []Message, opts Options) ([]tokenizer.Segment, error) {
	turns := mergeToolResults(msgs)
	sortToolResults(turns)

	drop := !opts.KeepThinking
	for _, t := range turns {
		if len(t.Tools) > 0 && t.Role != "user" { // merged user turns keep no tools
			drop = false
		}
	}
	if opts.Thinking && drop {
		turns = dropEarlyThinking(turns)
	}
	var o out
	if !opts.NoBOS {
		o.ctl(BOS)
	}
	for i := range turns {
		if err := renderTurn(&o, i, turns, opts.Thinking, drop); err != nil {
			return nil, err
		}
	}
	return o.segs, nil
}

// out collects rendered text as segments: template text, whose control
// tokens count, and message text, which is encoded as plain text.
type out struct {
	segs []tokenizer.Segment
}

func (o *out) add(s string, ctl bool) {
	if s == "" {
		return
	}
	if n := len(o.segs); n > 0 && o.segs[n-1].AllowSpecial == ctl {
		o.segs[n-1].Text += s
		return
	}
	o.segs = append(o.segs, tokenizer.Segment{Text: s, AllowSpecial: ctl})
}

// ctl adds template text (markers and fixed prompt text).
func (o *out) ctl(s string) { o.add(s, true) }

// text adds message text (contents, names, arguments, schemas).
func (o *out) text(s string) { o.add(s, false) }

// mergeToolResults turns tool messages into tool-result blocks of a user
// turn, and merges consecutive user messages (joined by a blank line), as
// DeepSeek-V4 has no tool role.
func mergeToolResults(msgs []Message) []turn {
	var out []turn
	for _, m := range msgs {
		last := len(out) - 1
		switch m.Role {
		case "tool":
			bl := block{text: m.Content, isResult: true, callID: m.ToolCallID}
			if last >= 0 && out[last].Role == "user" && out[last].hasBlocks {
				out[last].blocks = append(out[last].blocks, bl)
			} else {
				out = append(out, turn{Message: Message{Role: "user"}, blocks: []block{bl}, hasBlocks: true})
			}
		case "user":
			bl := block{text: m.Content}
			if last >= 0 && out[last].Role == "user" && out[last].hasBlocks && out[last].Task == "" {
				out[last].blocks = append(out[last].blocks, bl)
			} else {
				out = append(out, turn{Message: m, blocks: []block{bl}, hasBlocks: true})
			}
		default:
			out = append(out, turn{Message: m})
		}
	}
	return out
}

// sortToolResults orders the results in each user turn by the order of the
// calls of the latest assistant turn with calls (results with unknown ids
// sort as the first call).
func sortToolResults(turns []turn) {
	order := map[string]int{}
	for i := range turns {
		t := &turns[i]
		if t.Role == "assistant" && len(t.ToolCalls) > 0 {
			order = map[string]int{}
			for k, c := range t.ToolCalls {
				if c.ID != "" {
					order[c.ID] = k
				}
			}
			continue
		}
		if t.Role != "user" || len(order) == 0 {
			continue
		}
		var results []block
		for _, bl := range t.blocks {
			if bl.isResult {
				results = append(results, bl)
			}
		}
		if len(results) < 2 {
			continue
		}
		sort.SliceStable(results, func(a, b int) bool { return order[results[a].callID] < order[results[b].callID] })
		k := 0
		for j := range t.blocks {
			if t.blocks[j].isResult {
				t.blocks[j] = results[k]
				k++
			}
		}
	}
}

func lastUserIndex(turns []turn) int {
	for i := len(turns) - 1; i >= 0; i-- {
		if r := turns[i].Role; r == "user" || r == "developer" {
			return i
		}
	}
	return -1
}

// dropEarlyThinking removes the reasoning of assistant turns before the last
// user turn and drops developer (and unknown-role) turns there.
func dropEarlyThinking(turns []turn) []turn {
	last := lastUserIndex(turns)
	var out []turn
	for i, t := range turns {
		switch {
		case i >= last || t.Role == "user" || t.Role == "system" || t.Role == "tool" || t.Role == "latest_reminder":
			out = append(out, t)
		case t.Role == "assistant":
			t.ReasoningContent = ""
			out = append(out, t)
		}
	}
	return out
}

func renderTurn(o *out, i int, turns []turn, thinking, drop bool) error {
	t := &turns[i]
	lastUser := lastUserIndex(turns)
	switch t.Role {
	case "system":
		o.text(t.Content)
		if err := writeTools(o, t.Tools, i); err != nil {
			return err
		}
	case "developer":
		if t.Content == "" {
			return fmt.Errorf("chat: message %d: developer message has no content", i)
		}
		o.ctl(UserToken)
		o.text(t.Content)
		if err := writeTools(o, t.Tools, i); err != nil {
			return err
		}
	case "user":
		o.ctl(UserToken)
		for k, bl := range t.blocks {
			if k > 0 {
				o.ctl("\n\n")
			}
			if bl.isResult {
				o.ctl("<tool_result>")
				o.text(bl.text)
				o.ctl("</tool_result>")
			} else {
				o.text(bl.text)
			}
		}
	case "latest_reminder":
		o.ctl(ReminderToken)
		o.text(t.Content)
	case "assistant":
		prevTask := i > 0 && turns[i-1].Task != ""
		if thinking && !prevTask && (!drop || i > lastUser) {
			o.text(t.ReasoningContent)
			o.ctl(ThinkEnd)
		}
		o.text(t.Content)
		if len(t.ToolCalls) > 0 {
			if err := writeToolCalls(o, t.ToolCalls, i); err != nil {
				return err
			}
		}
		if !t.WoEOS {
			o.ctl(EOS)
		}
	default:
		return fmt.Errorf("chat: message %d: unknown role %q", i, t.Role)
	}

	if i+1 < len(turns) && turns[i+1].Role != "assistant" && turns[i+1].Role != "latest_reminder" {
		return nil
	}
	if t.Task != "" {
		tok, ok := taskTokens[t.Task]
		if !ok {
			return fmt.Errorf("chat: message %d: unknown task %q", i, t.Task)
		}
		if t.Task == "action" {
			o.ctl(AssistantToken)
			if thinking {
				o.ctl(ThinkStart)
			} else {
				o.ctl(ThinkEnd)
			}
		}
		o.ctl(tok)
		return nil
	}
	if t.Role == "user" || t.Role == "developer" {
		o.ctl(AssistantToken)
		if thinking && (!drop || i >= lastUser) {
			o.ctl(ThinkStart)
		} else {
			o.ctl(ThinkEnd)
		}
	}
	return nil
}

// toolsPrompt is DeepSeek-V4's tool-use instruction, as it appears in the
// official encoding test vectors (chat/testdata/test_output_1.txt); %s is the
// list of tool schemas, one JSON object per line.
const toolsPrompt = "## Tools\n\n" +
	"You have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n" +
	"<｜DSML｜tool_calls>\n" +
	"<｜DSML｜invoke name=\"$TOOL_NAME\">\n" +
	"<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n" +
	"...\n" +
	"</｜DSML｜invoke>\n" +
	"<｜DSML｜invoke name=\"$TOOL_NAME2\">\n" +
	"...\n" +
	"</｜DSML｜invoke>\n" +
	"</｜DSML｜tool_calls>\n\n" +
	"String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n" +
	"If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n" +
	"Otherwise, output directly after </think> with tool calls or final response.\n\n" +
	"### Available Tool Schemas\n\n" +
	"%s\n\n" +
	"You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"

func writeTools(o *out, tools []Tool, i int) error {
	if len(tools) == 0 {
		return nil
	}
	schemas := make([]string, len(tools))
	for k, tl := range tools {
		s, err := pyJSON(tl.Function)
		if err != nil {
			return fmt.Errorf("chat: message %d: tools[%d].function: %v", i, k, err)
		}
		schemas[k] = s
	}
	before, after, _ := strings.Cut(toolsPrompt, "%s")
	o.ctl("\n\n" + before)
	o.text(strings.Join(schemas, "\n"))
	o.ctl(after)
	return nil
}

// writeToolCalls renders calls as a DSML tool_calls block. Arguments that are
// not valid JSON are passed as one string parameter named "arguments".
func writeToolCalls(o *out, calls []ToolCall, i int) error {
	o.ctl("\n\n<" + DSML + "tool_calls>\n")
	for k, c := range calls {
		if k > 0 {
			o.ctl("\n")
		}
		o.ctl("<" + DSML + "invoke name=\"")
		o.text(c.Function.Name)
		o.ctl("\">\n")
		var fields []field
		if json.Valid([]byte(c.Function.Arguments)) {
			var err error
			if fields, err = orderedObject([]byte(c.Function.Arguments)); err != nil {
				return fmt.Errorf("chat: message %d: tool_calls[%d].function.arguments: want a JSON object: %v", i, k, err)
			}
		} else {
			q, _ := json.Marshal(c.Function.Arguments)
			fields = []field{{"arguments", q}}
		}
		for j, f := range fields {
			if j > 0 {
				o.ctl("\n")
			}
			var s string
			isStr := "false"
			if err := json.Unmarshal(f.raw, &s); err == nil {
				isStr = "true"
			} else if s, err = pyJSON(f.raw); err != nil {
				return fmt.Errorf("chat: message %d: tool_calls[%d].function.arguments[%q]: %v", i, k, f.key, err)
			}
			o.ctl("<" + DSML + "parameter name=\"")
			o.text(f.key)
			o.ctl("\" string=\"" + isStr + "\">")
			o.text(s)
			o.ctl("</" + DSML + "parameter>")
		}
		o.ctl("\n</" + DSML + "invoke>")
	}
	o.ctl("\n</" + DSML + "tool_calls>")
	return nil
}

// UnmarshalJSON accepts content as a string, null, or an OpenAI array of
// content parts; text parts are joined by a blank line and any other part
// becomes "[Unsupported TYPE]" (as DeepSeek's encoder does for tool results).
func (m *Message) UnmarshalJSON(data []byte) error {
	type plain Message
	var aux struct {
		plain
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(data, &aux); err != nil {
		return err
	}
	*m = Message(aux.plain)
	m.Content = ""
	c := aux.Content
	if len(c) == 0 || string(c) == "null" {
		return nil
	}
	if err := json.Unmarshal(c, &m.Content); err == nil {
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(c, &parts); err != nil {
		return fmt.Errorf("chat: message content: want a string or an array of content parts")
	}
	texts := make([]string, len(parts))
	for i, p := range parts {
		if p.Type == "text" {
			texts[i] = p.Text
		} else {
			texts[i] = "[Unsupported " + p.Type + "]"
		}
	}
	m.Content = strings.Join(texts, "\n\n")
	return nil
}
