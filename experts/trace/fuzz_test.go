package trace

import (
	"bytes"
	"slices"
	"testing"
)

// FuzzRead: any input either fails with an error or reads back as a trace that
// re-encodes to exactly the input bytes (the format has one encoding).
func FuzzRead(f *testing.F) {
	good := validFile(f)
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add(good[:30])
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := Read(bytes.NewReader(data))
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		var buf bytes.Buffer
		w, err := NewWriter(&buf, tr.Header)
		if err != nil {
			t.Fatalf("accepted header %+v does not write: %v", tr.Header, err)
		}
		for _, r := range tr.Records {
			w.RecordRoute(r.Pos, r.Layer, r.Experts, r.Weights)
		}
		if err := w.Close(); err != nil {
			t.Fatalf("accepted records do not write: %v", err)
		}
		if !slices.Equal(buf.Bytes(), data) {
			t.Fatalf("re-encoding differs: %d bytes vs %d", buf.Len(), len(data))
		}
	})
}
