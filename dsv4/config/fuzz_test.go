package config

import (
	"testing"
)

// FuzzParse: any input either fails with an error or yields a configuration that
// validates and whose layout can be listed without panicking.
func FuzzParse(f *testing.F) {
	f.Add(Tiny().HubJSON())
	f.Add(Flash().HubJSON())
	f.Add([]byte(`{"model_type":"deepseek_v4"}`))
	f.Add([]byte(`{"hidden_size":1e300}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that does not validate: %v", err)
		}
		// Keep the layout walk bounded: huge but valid configs are legal input.
		if int64(c.NLayers+c.NMTPLayers)*int64(c.NRoutedExperts) > 1<<16 {
			return
		}
		for _, tn := range Layout(c) {
			for _, d := range tn.Shape {
				if d < 0 {
					t.Fatalf("%s has negative dimension %v", tn.Name, tn.Shape)
				}
			}
		}
	})
}
