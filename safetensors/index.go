package safetensors

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// IndexFile is the conventional name of a sharded checkpoint's index.
const IndexFile = "model.safetensors.index.json"

// maxIndexSize bounds the size of an index file (the V4-Flash index is a few MiB).
const maxIndexSize = 256 << 20

// maxIndexDepth bounds JSON nesting in an index (top object = 1); it only matters
// for metadata entries other than total_size, which are skipped.
const maxIndexDepth = 4

// Index is a sharded checkpoint's index, model.safetensors.index.json:
// {"metadata": {"total_size": N}, "weight_map": {tensor: shard file name}}.
// TotalSize is the sum of all tensors' byte sizes as recorded by the writer.
type Index struct {
	TotalSize int64
	WeightMap map[string]string
}

// Shards returns the distinct shard file names of ix, sorted.
func (ix *Index) Shards() []string {
	var out []string
	seen := make(map[string]struct{})
	for _, s := range ix.WeightMap {
		if _, ok := seen[s]; !ok {
			seen[s] = struct{}{}
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// checkShardName reports why s is not a plain file name, or "".
func checkShardName(s string) string {
	switch {
	case s == "":
		return "is empty"
	case s == "." || s == "..":
		return "is a directory reference"
	case strings.ContainsAny(s, "/\\"):
		return "contains a path separator"
	case strings.Contains(s, ".."):
		return `contains ".."`
	case strings.ContainsRune(s, 0):
		return "contains a NUL byte"
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	return ""
}

// ReadIndex reads and validates a shard index. The JSON must be one object with
// exactly the keys "metadata" (an object whose "total_size" is a non-negative
// integer; other metadata entries are skipped, nesting at most 4 levels deep) and
// "weight_map" (an object of tensor name -> shard file name). Duplicate keys,
// empty tensor names, and shard names that are not plain file names (empty,
// containing a slash, a backslash, "..", or NUL) are errors naming the file,
// the tensor and the field.
func ReadIndex(path string) (*Index, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxIndexSize+1))
	if err != nil {
		return nil, fmt.Errorf("safetensors: read %s: %w", path, err)
	}
	if len(data) > maxIndexSize {
		return nil, &FormatError{Path: path, Field: "file", Msg: fmt.Sprintf("larger than the %d-byte index limit", maxIndexSize)}
	}
	return parseIndex(path, data)
}

func parseIndex(path string, data []byte) (*Index, error) {
	s := &scanner{b: data}
	ix := &Index{}
	var haveMeta, haveMap, haveTotal bool
	if s.peek() != '{' {
		return nil, &FormatError{Path: path, Field: "json",
			Msg: fmt.Sprintf("index must be one JSON object starting with '{', found %s", s.found())}
	}
	field := "json"
	err := s.object("the index", func(key []byte) error {
		switch string(key) {
		case "metadata":
			field = "metadata"
			if haveMeta {
				return s.errf("key appears twice")
			}
			haveMeta = true
			err := s.object("metadata", func(k []byte) error {
				if string(k) != "total_size" {
					return s.skipValue(3, maxIndexDepth)
				}
				field = "metadata.total_size"
				if haveTotal {
					return s.errf("key appears twice")
				}
				haveTotal = true
				v, err := s.uint()
				if err != nil {
					return err
				}
				ix.TotalSize = v
				field = "metadata"
				return nil
			})
			if err != nil {
				return err
			}
			field = "json"
			return nil
		case "weight_map":
			field = "weight_map"
			if haveMap {
				return s.errf("key appears twice")
			}
			haveMap = true
			ix.WeightMap = make(map[string]string)
			err := s.object("weight_map", func(key []byte) error {
				name := string(key)
				if name == "" {
					return &FormatError{Path: path, Field: "weight_map", Msg: "empty tensor name, want a non-empty string"}
				}
				if _, dup := ix.WeightMap[name]; dup {
					return &FormatError{Path: path, Tensor: name, Field: "weight_map", Msg: "tensor appears twice, want each name once"}
				}
				if s.peek() != '"' {
					return &FormatError{Path: path, Tensor: name, Field: "weight_map",
						Msg: fmt.Sprintf("shard must be a string file name, found %s", s.found())}
				}
				shard, err := s.str()
				if err != nil {
					return wrap(err, path, name, "weight_map")
				}
				if why := checkShardName(shard); why != "" {
					return &FormatError{Path: path, Tensor: name, Field: "weight_map",
						Msg: fmt.Sprintf("shard name %q %s, want a plain file name", shard, why)}
				}
				ix.WeightMap[name] = shard
				return nil
			})
			if err != nil {
				return err
			}
			field = "json"
			return nil
		default:
			return fmt.Errorf("unknown key %q, want only metadata and weight_map", key)
		}
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		return nil, wrap(err, path, "", field)
	}
	switch {
	case !haveMeta:
		return nil, &FormatError{Path: path, Field: "metadata", Msg: "missing, want {\"total_size\": N}"}
	case !haveTotal:
		return nil, &FormatError{Path: path, Field: "metadata.total_size", Msg: "missing, want the total tensor bytes as a non-negative integer"}
	case !haveMap:
		return nil, &FormatError{Path: path, Field: "weight_map", Msg: "missing, want an object of tensor name -> shard file name"}
	}
	return ix, nil
}

// WriteIndex writes ix to path atomically (temp file + rename), deterministically:
// two-space indentation, weight_map keys sorted. It validates what ReadIndex
// checks, so a written index always reads back equal.
func WriteIndex(path string, ix *Index) error {
	if ix.TotalSize < 0 {
		return fmt.Errorf("safetensors: write index %s: total_size %d is negative", path, ix.TotalSize)
	}
	names := make([]string, 0, len(ix.WeightMap))
	for name, shard := range ix.WeightMap {
		if name == "" || !utf8.ValidString(name) {
			return fmt.Errorf("safetensors: write index %s: tensor name %q must be non-empty valid UTF-8", path, name)
		}
		if why := checkShardName(shard); why != "" {
			return fmt.Errorf("safetensors: write index %s: tensor %q: shard name %q %s, want a plain file name", path, name, shard, why)
		}
		names = append(names, name)
	}
	slices.Sort(names)
	b := make([]byte, 0, 64+len(names)*80)
	b = append(b, "{\n  \"metadata\": {\n    \"total_size\": "...)
	b = strconv.AppendInt(b, ix.TotalSize, 10)
	b = append(b, "\n  },\n  \"weight_map\": {"...)
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, "\n    "...)
		b = appendString(b, name)
		b = append(b, ": "...)
		b = appendString(b, ix.WeightMap[name])
	}
	if len(names) > 0 {
		b = append(b, "\n  "...)
	}
	b = append(b, "}\n}\n"...)
	if err := writeFileAtomic(path, b); err != nil {
		return fmt.Errorf("safetensors: write index %s: %w", path, err)
	}
	return nil
}
