package main

import (
	"bytes"
	"strings"
	"testing"
)

func runExpertsCmd(f func([]string, *strings.Reader, *bytes.Buffer, *bytes.Buffer) error, args ...string) (string, string, error) {
	var out, errb bytes.Buffer
	err := f(args, strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), err
}

func planCmd(args []string, in *strings.Reader, out, errb *bytes.Buffer) error {
	return runPlan(args, in, out, errb)
}

func TestPlanCommand(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    []string
		wantErr string
	}{
		{"flash 24GiB", []string{"synth:flash", "--mem", "24GiB", "--ctx", "32768"},
			[]string{"SYNTHETIC", "--mem 24GiB", "dense weights", "13,760 B/token", "of 11,008", "per layer", "slow tier"}, ""},
		{"default budget", []string{"synth:tiny"}, []string{"80% of the", "MemAvailable", "Every routed expert fits"}, ""},
		{"refused", []string{"synth:flash", "--mem", "4GiB"}, nil, "cannot hold the dense part: need at least"},
		{"bad mem", []string{"synth:flash", "--mem", "lots"}, nil, "--mem"},
		{"no model", []string{"--mem", "1GiB"}, nil, "want exactly one MODEL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := runExpertsCmd(planCmd, tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
