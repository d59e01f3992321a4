package chat

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
)

// The golden vectors are DeepSeek's official encoding tests
// (encoding/tests/test_input_N.json -> test_output_N.txt), copied unchanged.
func loadVector(t *testing.T, n int) ([]Message, string) {
	t.Helper()
	in, err := os.ReadFile(fmt.Sprintf("testdata/test_input_%d.json", n))
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(fmt.Sprintf("testdata/test_output_%d.txt", n))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []Message
	if n == 1 { // {"tools": [...], "messages": [...]}; the tools go on message 0
		var v struct {
			Tools    []Tool    `json:"tools"`
			Messages []Message `json:"messages"`
		}
		if err := json.Unmarshal(in, &v); err != nil {
			t.Fatal(err)
		}
		msgs = v.Messages
		msgs[0].Tools = v.Tools
	} else if err := json.Unmarshal(in, &msgs); err != nil {
		t.Fatal(err)
	}
	return msgs, string(out)
}

func TestGoldenVectors(t *testing.T) {
	for _, c := range []struct {
		n    int
		opts Options
	}{
		{1, Options{Thinking: true}}, // thinking mode with tools
		{2, Options{Thinking: true}}, // thinking without tools: drop_thinking
		{3, Options{Thinking: true}}, // developer with tools, latest_reminder, tool result
		{4, Options{}},               // chat mode, latest_reminder, action task
	} {
		t.Run(fmt.Sprint(c.n), func(t *testing.T) {
			msgs, want := loadVector(t, c.n)
			got, err := Render(msgs, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				i := 0
				for i < len(got) && i < len(want) && got[i] == want[i] {
					i++
				}
				t.Errorf("mismatch at byte %d:\n got …%q\nwant …%q", i, got[max(0, i-40):min(len(got), i+80)], want[max(0, i-40):min(len(want), i+80)])
			}
		})
	}
}

func TestRenderModes(t *testing.T) {
	conv := []Message{
		{Role: "system", Content: "S"},
		{Role: "user", Content: "U1"},
		{Role: "assistant", ReasoningContent: "R1", Content: "A1"},
		{Role: "user", Content: "U2"},
	}
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"chat", Options{}, BOS + "S" + UserToken + "U1" + AssistantToken + ThinkEnd + "A1" + EOS + UserToken + "U2" + AssistantToken + ThinkEnd},
		{"thinking drops old reasoning", Options{Thinking: true},
			BOS + "S" + UserToken + "U1" + AssistantToken + ThinkEnd + "A1" + EOS + UserToken + "U2" + AssistantToken + ThinkStart},
		{"thinking keeps reasoning", Options{Thinking: true, KeepThinking: true},
			BOS + "S" + UserToken + "U1" + AssistantToken + ThinkStart + "R1" + ThinkEnd + "A1" + EOS + UserToken + "U2" + AssistantToken + ThinkStart},
		{"no bos", Options{NoBOS: true}, "S" + UserToken + "U1" + AssistantToken + ThinkEnd + "A1" + EOS + UserToken + "U2" + AssistantToken + ThinkEnd},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			got, err := Render(conv, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got  %q\nwant %q", got, c.want)
			}
		})
	}
}

func TestRenderToolResultsAndMerging(t *testing.T) {
	msgs := []Message{
		{Role: "user", Content: "q"},
		{Role: "assistant", ToolCalls: []ToolCall{
			{ID: "a", Function: FunctionCall{Name: "f", Arguments: `{"x": 1, "s": "v\n", "l": [1,{"k":"é"}]}`}},
			{ID: "b", Function: FunctionCall{Name: "g", Arguments: `not json`}},
		}},
		{Role: "tool", ToolCallID: "b", Content: "B"},
		{Role: "tool", ToolCallID: "a", Content: "A"},
		{Role: "user", Content: "more"},
	}
	got, err := Render(msgs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := BOS + UserToken + "q" + AssistantToken + ThinkEnd +
		"\n\n<｜DSML｜tool_calls>\n" +
		"<｜DSML｜invoke name=\"f\">\n" +
		"<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n" +
		"<｜DSML｜parameter name=\"s\" string=\"true\">v\n</｜DSML｜parameter>\n" +
		"<｜DSML｜parameter name=\"l\" string=\"false\">[1, {\"k\": \"é\"}]</｜DSML｜parameter>\n" +
		"</｜DSML｜invoke>\n" +
		"<｜DSML｜invoke name=\"g\">\n" +
		"<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>\n" +
		"</｜DSML｜invoke>\n" +
		"</｜DSML｜tool_calls>" + EOS +
		UserToken + "<tool_result>A</tool_result>\n\n<tool_result>B</tool_result>\n\nmore" + AssistantToken + ThinkEnd
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name string
		msgs []Message
		want string
	}{
		{"unknown role", []Message{{Role: "robot"}}, "message 0: unknown role"},
		{"empty developer", []Message{{Role: "developer"}}, "message 0: developer"},
		{"bad task", []Message{{Role: "user", Content: "x", Task: "dance"}}, "unknown task"},
		{"array arguments", []Message{{Role: "assistant", ToolCalls: []ToolCall{{Function: FunctionCall{Name: "f", Arguments: "[1]"}}}}}, "want a JSON object"},
		{"bad tool schema", []Message{{Role: "system", Tools: []Tool{{Function: json.RawMessage(`{"a":`)}}}}, "tools[0].function"},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			_, err := Render(c.msgs, Options{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
}

func TestPyJSON(t *testing.T) {
	for in, want := range map[string]string{
		`{"b":1,"a":[true,false,null],"c":{"d":"x"}}`: `{"b": 1, "a": [true, false, null], "c": {"d": "x"}}`,
		`"é\u0001\n\"\\/"`:                            `"é\u0001\n\"\\/"`,
		`[]`:                                          `[]`,
		`{}`:                                          `{}`,
		`1.50`:                                        `1.50`,
	} {
		got, err := pyJSON([]byte(in))
		if err != nil || got != want {
			t.Errorf("pyJSON(%s) = %s, %v; want %s", in, got, err, want)
		}
	}
	if _, err := pyJSON([]byte(`{"a":1} x`)); err == nil {
		t.Error("trailing data accepted")
	}
}

func TestMessageContentForms(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"role":"tool","content":"x"}`, "x"},
		{`{"role":"tool","content":null}`, ""},
		{`{"role":"tool"}`, ""},
		{`{"role":"tool","content":[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}]}`, "a\n\n[Unsupported image_url]\n\nb"},
	} {
		var m Message
		if err := json.Unmarshal([]byte(c.in), &m); err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if m.Content != c.want || m.Role != "tool" {
			t.Errorf("%s: content %q, want %q", c.in, m.Content, c.want)
		}
	}
	var m Message
	if err := json.Unmarshal([]byte(`{"role":"user","content":5}`), &m); err == nil {
		t.Error("numeric content accepted")
	}
}
