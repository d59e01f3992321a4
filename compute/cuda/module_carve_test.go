package cuda

import (
	"reflect"
	"strings"
	"testing"
)

// TestParseCarve checks $MOXIE_CUDA_CARVE's grammar: unset is the default
// rules on sm_90 and none elsewhere, "off" none, PREFIX:PERCENT items in
// order on any device, and bad items are errors naming the variable and
// the item.
func TestParseCarve(t *testing.T) {
	for _, tc := range []struct {
		in      string
		major   int
		want    []carveRule
		wantErr string
	}{
		{"", 9, defaultCarve, ""},
		{"", 8, nil, ""}, // the default was measured on sm_90 only
		{"off", 9, nil, ""},
		{"moe1lx:44", 9, []carveRule{{"moe1lx", 44}}, ""},
		{"moe1lx:44", 8, []carveRule{{"moe1lx", 44}}, ""},
		{"moe1lx:44,gemvm_f4:0,moe2:100", 9, []carveRule{{"moe1lx", 44}, {"gemvm_f4", 0}, {"moe2", 100}}, ""},
		{"moe1lx", 9, nil, `item "moe1lx"`},
		{"moe1lx:101", 9, nil, "PERCENT 0..100"},
		{":40", 9, nil, `item ":40"`},
		{"a:1,,b:2", 9, nil, `item ""`},
		{"moe1lx:x", 9, nil, "MOXIE_CUDA_CARVE"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseCarve(tc.in, tc.major)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseCarve(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("parseCarve(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}
