package safetensors

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestIndexRoundTrip(t *testing.T) {
	ix := &Index{TotalSize: 159609485896, WeightMap: map[string]string{
		"embed.weight":                      "model-00001-of-00046.safetensors",
		"layers.0.attn.wq_a.weight":         "model-00002-of-00046.safetensors",
		"layers.0.attn.wq_a.scale":          "model-00002-of-00046.safetensors",
		"head.weight":                       "model-00046-of-00046.safetensors",
		"odd \"name\"\twith é":              "shard.safetensors",
		"layers.10.ffn.experts.3.w1.weight": "model-00007-of-00046.safetensors",
	}}
	dir := t.TempDir()
	p := filepath.Join(dir, IndexFile)
	if err := WriteIndex(p, ix); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	// Oracle: encoding/json reads the same content.
	var o struct {
		Metadata  map[string]int64  `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatalf("encoding/json rejects written index: %v", err)
	}
	if o.Metadata["total_size"] != ix.TotalSize || !maps.Equal(o.WeightMap, ix.WeightMap) {
		t.Fatalf("oracle read %+v", o)
	}
	got, err := ReadIndex(p)
	if err != nil {
		t.Fatal(err)
	}
	if got.TotalSize != ix.TotalSize || !maps.Equal(got.WeightMap, ix.WeightMap) {
		t.Fatalf("read back %+v", got)
	}
	wantShards := []string{"model-00001-of-00046.safetensors", "model-00002-of-00046.safetensors",
		"model-00007-of-00046.safetensors", "model-00046-of-00046.safetensors", "shard.safetensors"}
	if s := got.Shards(); !slices.Equal(s, wantShards) {
		t.Fatalf("Shards = %q", s)
	}
	// Deterministic: writing again gives identical bytes; keys appear sorted.
	p2 := filepath.Join(dir, "again.json")
	if err := WriteIndex(p2, got); err != nil {
		t.Fatal(err)
	}
	raw2, _ := os.ReadFile(p2)
	if string(raw) != string(raw2) {
		t.Fatal("WriteIndex is not deterministic")
	}
	if i, j := strings.Index(string(raw), `"embed.weight"`), strings.Index(string(raw), `"head.weight"`); i < 0 || j < i {
		t.Fatal("weight_map keys not sorted")
	}
	if names := listDir(t, dir); !slices.Equal(names, []string{"again.json", IndexFile}) {
		t.Fatalf("directory holds %q", names)
	}
	// Empty map.
	if err := WriteIndex(p2, &Index{}); err != nil {
		t.Fatal(err)
	}
	e, err := ReadIndex(p2)
	if err != nil || e.TotalSize != 0 || len(e.WeightMap) != 0 || e.WeightMap == nil {
		t.Fatalf("empty index read back %+v, %v", e, err)
	}
}

func TestReadIndexAcceptsHubForms(t *testing.T) {
	cases := []struct {
		name string
		text string
		want Index
	}{
		{"compact", `{"metadata":{"total_size":10},"weight_map":{"a":"s1.safetensors"}}`,
			Index{10, map[string]string{"a": "s1.safetensors"}}},
		{"reordered with extra metadata", `{"weight_map": {"a": "s1", "b": "s2"}, "metadata": {"total_parameters": 5.5e3, "note": {"x": [1, "y", null, true, false]}, "total_size": 0}}`,
			Index{0, map[string]string{"a": "s1", "b": "s2"}}},
		{"escaped names", `{"metadata":{"total_size":3},"weight_map":{"caf\u00e9":"sh\u00e4rd"}}`,
			Index{3, map[string]string{"café": "shärd"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "i.json")
			os.WriteFile(p, []byte(c.text), 0o644)
			got, err := ReadIndex(p)
			if err != nil {
				t.Fatal(err)
			}
			if got.TotalSize != c.want.TotalSize || !maps.Equal(got.WeightMap, c.want.WeightMap) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestReadIndexRejects(t *testing.T) {
	const meta = `"metadata":{"total_size":1}`
	cases := []struct {
		name   string
		text   string
		field  string
		tensor string
		msg    string
	}{
		{"empty", ``, "json", "", "starting with '{'"},
		{"array", `[]`, "json", "", "starting with '{'"},
		{"trailing", `{` + meta + `,"weight_map":{}} {}`, "json", "", "after the top-level object"},
		{"missing metadata", `{"weight_map":{}}`, "metadata", "", "missing"},
		{"missing total", `{"metadata":{},"weight_map":{}}`, "metadata.total_size", "", "missing"},
		{"missing weight_map", `{` + meta + `}`, "weight_map", "", "missing"},
		{"unknown top key", `{` + meta + `,"weight_map":{},"x":1}`, "json", "", `unknown key "x"`},
		{"negative total", `{"metadata":{"total_size":-1},"weight_map":{}}`, "metadata.total_size", "", "negative"},
		{"fractional total", `{"metadata":{"total_size":1.5},"weight_map":{}}`, "metadata.total_size", "", "fraction"},
		{"string total", `{"metadata":{"total_size":"1"},"weight_map":{}}`, "metadata.total_size", "", "non-negative integer"},
		{"huge total", `{"metadata":{"total_size":99999999999999999999},"weight_map":{}}`, "metadata.total_size", "", "int64"},
		{"duplicate total", `{"metadata":{"total_size":1,"total_size":2},"weight_map":{}}`, "metadata.total_size", "", "twice"},
		{"duplicate metadata", `{` + meta + `,` + meta + `,"weight_map":{}}`, "metadata", "", "twice"},
		{"duplicate weight_map", `{` + meta + `,"weight_map":{},"weight_map":{}}`, "weight_map", "", "twice"},
		{"deep metadata", `{"metadata":{"total_size":1,"x":[[[1]]]},"weight_map":{}}`, "metadata", "", "deeper than 4"},
		{"very deep metadata", `{"metadata":{"total_size":1,"x":` + deep("[", "]", 100000) + `},"weight_map":{}}`, "metadata", "", "deeper than 4"},
		{"bad metadata literal", `{"metadata":{"total_size":1,"x":nul},"weight_map":{}}`, "metadata", "", "expected null"},
		{"bad metadata number", `{"metadata":{"total_size":1,"x":01},"weight_map":{}}`, "metadata", "", "leading zero"},
		{"weight_map array", `{` + meta + `,"weight_map":[]}`, "weight_map", "", "'{'"},
		{"duplicate tensor", `{` + meta + `,"weight_map":{"a":"s","a":"s"}}`, "weight_map", "a", "twice"},
		{"empty tensor", `{` + meta + `,"weight_map":{"":"s"}}`, "weight_map", "", "empty tensor name"},
		{"shard not string", `{` + meta + `,"weight_map":{"a":1}}`, "weight_map", "a", "must be a string"},
		{"shard empty", `{` + meta + `,"weight_map":{"a":""}}`, "weight_map", "a", "is empty"},
		{"shard slash", `{` + meta + `,"weight_map":{"a":"sub/s.safetensors"}}`, "weight_map", "a", "path separator"},
		{"shard absolute", `{` + meta + `,"weight_map":{"a":"/etc/passwd"}}`, "weight_map", "a", "path separator"},
		{"shard backslash", `{` + meta + `,"weight_map":{"a":"..\\x"}}`, "weight_map", "a", "path separator"},
		{"shard dotdot", `{` + meta + `,"weight_map":{"a":".."}}`, "weight_map", "a", "directory reference"},
		{"shard dot", `{` + meta + `,"weight_map":{"a":"."}}`, "weight_map", "a", "directory reference"},
		{"shard contains dotdot", `{` + meta + `,"weight_map":{"a":"x..y"}}`, "weight_map", "a", `".."`},
		{"shard NUL", `{` + meta + `,"weight_map":{"a":"x\u0000y"}}`, "weight_map", "a", "NUL"},
		{"shard escaped slash", `{` + meta + `,"weight_map":{"a":"x\/y"}}`, "weight_map", "a", "path separator"},
		{"bad utf8", "{" + meta + ",\"weight_map\":{\"a\":\"\xff\"}}", "weight_map", "a", "UTF-8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "i.json")
			os.WriteFile(p, []byte(c.text), 0o644)
			_, err := ReadIndex(p)
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("got %v, want *FormatError", err)
			}
			if fe.Path != p || fe.Field != c.field || fe.Tensor != c.tensor || !strings.Contains(fe.Msg, c.msg) {
				t.Fatalf("got path=%q field=%q tensor=%q msg=%q\nwant field=%q tensor=%q msg containing %q",
					fe.Path, fe.Field, fe.Tensor, fe.Msg, c.field, c.tensor, c.msg)
			}
		})
	}
	if _, err := ReadIndex(filepath.Join(t.TempDir(), "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing index: %v", err)
	}
}

func TestWriteIndexRejects(t *testing.T) {
	cases := []struct {
		name string
		ix   Index
		msg  string
	}{
		{"negative total", Index{-1, nil}, "negative"},
		{"empty tensor", Index{0, map[string]string{"": "s"}}, "non-empty"},
		{"bad shard", Index{0, map[string]string{"a": "../s"}}, "path separator"},
		{"dotdot shard", Index{0, map[string]string{"a": ".."}}, "directory reference"},
		{"empty shard", Index{0, map[string]string{"a": ""}}, "is empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			err := WriteIndex(filepath.Join(dir, IndexFile), &c.ix)
			if err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("got %v, want error containing %q", err, c.msg)
			}
			if names := listDir(t, dir); len(names) != 0 {
				t.Fatalf("directory holds %q", names)
			}
		})
	}
}
