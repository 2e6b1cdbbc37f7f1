package envoyrls

import (
	"context"
	"testing"

	"github.com/weir-dev/weir/store/memstore"
)

// Any file either loads or gets a *ConfigError; nothing panics.
func FuzzParse(f *testing.F) {
	for _, s := range []string{exampleYAML, replacesYAML, basicYAML, "", "---\n", "domain: d\ndescriptors:\n  - key: a\n    value: b*\n    share_threshold: true\n    rate_limit: {limit: 5/m burst 2, algorithm: gcra}\n", "domain: &a d\ndescriptors: [*a]\n", "domain: d\ndescriptors:\n  - &x {key: a}\n  - *x\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, "f.yaml")
		if err == nil {
			_ = cfg.Rules()
			return
		}
		if _, ok := err.(*ConfigError); !ok {
			t.Fatalf("error %T %v is not a *ConfigError", err, err)
		}
	})
}

// Any body gets a response or an error; nothing panics.
func FuzzCheckJSON(f *testing.F) {
	for _, s := range []string{
		`{"domain":"rl","descriptors":[{"entries":[{"key":"foo","value":"x"},{"key":"bar","value":"banned"}]}]}`,
		`{"domain":"rl","hits_addend":7,"descriptors":[{"entries":[{"key":"foo","value":"x"}],"hits_addend":"0"},{"entries":[{"key":"qux"}]}]}`,
		`{"domain":"rl","descriptors":[{"entries":[{"key":"foo"}],"limit":{"requests_per_unit":3,"unit":"HOUR","unit_multiplier":2}}]}`,
		`{"domain":"rl","descriptors":[{}]}`, `{}`, `[]`, `null`,
	} {
		f.Add([]byte(s))
	}
	cfg, err := Parse([]byte(exampleYAML), "example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	svc := New(cfg, memstore.New())
	f.Fuzz(func(t *testing.T, body []byte) {
		out, status, err := svc.CheckJSON(context.Background(), body)
		if len(out) == 0 || status == 0 || (err != nil) != (status >= 400 && status != 429) {
			t.Fatalf("CheckJSON(%q) = %q, %d, %v", body, out, status, err)
		}
	})
}
