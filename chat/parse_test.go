package chat

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// assistantTurns returns the text after each "<｜Assistant｜><think>" opener
// up to the next user turn (or the end) in golden output n.
func assistantTurns(t *testing.T, n int) []string {
	_, out := loadVector(t, n)
	var turns []string
	marker := AssistantToken + ThinkStart
	for _, part := range strings.Split(out, marker)[1:] {
		if i := strings.Index(part, UserToken); i >= 0 {
			part = part[:i]
		}
		turns = append(turns, part)
	}
	return turns
}

func TestParseGoldenTurns(t *testing.T) {
	// The expectations are those of DeepSeek's own test of its parser.
	turns := assistantTurns(t, 1)
	if len(turns) != 2 {
		t.Fatalf("found %d assistant turns in vector 1, want 2", len(turns))
	}
	p, err := ParseCompletion(turns[0], true)
	if err != nil {
		t.Fatal(err)
	}
	if p.ReasoningContent != "The user wants to know the weather in Beijing. I should use the get_weather tool." || p.Content != "" {
		t.Errorf("turn 1: %+v", p)
	}
	if len(p.ToolCalls) != 1 || p.ToolCalls[0].Function.Name != "get_weather" {
		t.Fatalf("turn 1 tool calls: %+v", p.ToolCalls)
	}
	var args map[string]any
	if err := json.Unmarshal([]byte(p.ToolCalls[0].Function.Arguments), &args); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(args, map[string]any{"location": "Beijing", "unit": "celsius"}) {
		t.Errorf("arguments = %v", args)
	}
	p, err = ParseCompletion(turns[1], true)
	if err != nil {
		t.Fatal(err)
	}
	if p.ReasoningContent != "Got the weather data. Let me format a nice response." || !strings.Contains(p.Content, "22°C") || len(p.ToolCalls) != 0 {
		t.Errorf("turn 2: %+v", p)
	}

	turns = assistantTurns(t, 2)
	p, err = ParseCompletion(turns[len(turns)-1], true)
	if err != nil {
		t.Fatal(err)
	}
	if p.ReasoningContent != "The user asks about the capital of France. It is Paris." || p.Content != "The capital of France is Paris." {
		t.Errorf("vector 2 last turn: %+v", p)
	}
}

func TestParseRoundTripsRender(t *testing.T) {
	// A rendered assistant turn parses back to the message it came from.
	calls := []ToolCall{{Type: "function", Function: FunctionCall{Name: "f", Arguments: `{"a": "x\ny", "n": [1, 2], "o": {"k": null}}`}}}
	msg := Message{Role: "assistant", ReasoningContent: "think", Content: "answer", ToolCalls: calls}
	out, err := Render([]Message{{Role: "user", Content: "q"}, msg}, Options{Thinking: true})
	if err != nil {
		t.Fatal(err)
	}
	turn := out[strings.Index(out, ThinkStart)+len(ThinkStart):]
	p, err := ParseCompletion(turn, true)
	if err != nil {
		t.Fatal(err)
	}
	if p.ReasoningContent != "think" || p.Content != "answer" || !reflect.DeepEqual(p.ToolCalls, calls) {
		t.Errorf("parsed %+v", p)
	}
}

// streamParse feeds text in chunks of the given sizes (cycled).
func streamParse(text string, thinking bool, sizes []int) (Parsed, error) {
	p := NewParser(thinking)
	var r, c strings.Builder
	for k := 0; text != ""; k++ {
		n := min(len(text), max(1, sizes[k%len(sizes)]))
		d := p.Add(text[:n])
		text = text[n:]
		r.WriteString(d.Reasoning)
		c.WriteString(d.Content)
	}
	d, calls, err := p.Finish()
	r.WriteString(d.Reasoning)
	c.WriteString(d.Content)
	return Parsed{ReasoningContent: r.String(), Content: c.String(), ToolCalls: calls}, err
}

func TestParserStreaming(t *testing.T) {
	texts := append(assistantTurns(t, 1), assistantTurns(t, 3)...)
	texts = append(texts, "no think end", "a</thi", "x</think>y<｜end▁of▁se", "r</think>\n\n<｜DSML｜tool_ca")
	for _, text := range texts {
		want, wantErr := ParseCompletion(text, true)
		for _, sizes := range [][]int{{1}, {2}, {3}, {7}, {1, 5, 2}} {
			got, err := streamParse(text, true, sizes)
			if !reflect.DeepEqual(got, want) || (err == nil) != (wantErr == nil) {
				t.Errorf("%q in chunks %v: got %+v, %v; want %+v, %v", text, sizes, got, err, want, wantErr)
			}
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, text string
		thinking   bool
		want       string
	}{
		{"no think end", "reasoning only", true, "not closed"},
		{"after eos", "a" + EOS + "b", false, "after EOS"},
		{"bad block", "x" + toolCallsStart + ">\n<junk>", false, "malformed DSML"},
		{"bad flag", "x" + toolCallsStart + ">\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"maybe\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", false, "string must be"},
		{"duplicate", "x" + toolCallsStart + ">\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", false, "duplicate"},
		{"unterminated", "x" + toolCallsStart + ">\n<｜DSML｜invoke name=\"f", false, "unterminated"},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseCompletion(c.text, c.thinking)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
	if _, err := ParseCompletion("r", true); !errors.Is(err, ErrNoThinkEnd) {
		t.Errorf("err = %v, want ErrNoThinkEnd", err)
	}
}

func FuzzParser(f *testing.F) {
	f.Add("r</think>c<｜end▁of▁sentence｜>", true, uint8(3))
	f.Add("c\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", false, uint8(1))
	f.Fuzz(func(t *testing.T, text string, thinking bool, chunk uint8) {
		want, wantErr := ParseCompletion(text, thinking)
		got, err := streamParse(text, thinking, []int{int(chunk%16) + 1})
		if !reflect.DeepEqual(got, want) || (err == nil) != (wantErr == nil) {
			t.Fatalf("stream %+v, %v; whole %+v, %v", got, err, want, wantErr)
		}
		for _, s := range []string{want.Content, want.ReasoningContent} {
			if strings.Contains(s, ThinkEnd) && thinking && s == want.ReasoningContent {
				t.Fatalf("reasoning contains </think>: %q", s)
			}
		}
	})
}

func FuzzRender(f *testing.F) {
	f.Add("system", "user", "hi", `{"a": 1}`, true)
	f.Add("tool", "developer", "", `[`, false)
	f.Fuzz(func(t *testing.T, role1, role2, content, args string, thinking bool) {
		msgs := []Message{
			{Role: role1, Content: content, Task: ""},
			{Role: role2, Content: content, ToolCalls: []ToolCall{{Function: FunctionCall{Name: "f", Arguments: args}}}},
		}
		_, _ = Render(msgs, Options{Thinking: thinking})
	})
}
