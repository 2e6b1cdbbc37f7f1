package policy

import (
	"errors"
	"reflect"
	"testing"

	"github.com/weir-dev/weir/policy/config"
)

// TestParseYAMLProblems: problems that internal/yamlnode finds in the YAML
// itself, each at its line and column. weir.yaml used to read a value that
// contradicts its tag as text (or "!!bool yes" as false), to ignore a
// merge of something other than a mapping, and to report an alias cycle
// as whatever type error the walk met first.
func TestParseYAMLProblems(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		want      []string
	}{
		{"alias cycle", "rules: &z\n  - {name: *z, limit: 1/s}\n",
			[]string{`2:12: anchor 'z' value contains itself`}},
		{"merge cycle", "store: &s\n  <<: *s\nrules: []\n",
			[]string{`2:7: anchor 's' value contains itself`}},
		{"merge of a scalar", "store: {<<: 5, type: memory}\nrules: []\n",
			[]string{`1:9: a merge (<<) needs a mapping or a list of mappings`}},
		{"contradicted bool tag", "shadow: !!bool yes\nrules: []\n",
			[]string{"1:9: cannot decode !!str `yes` as a !!bool"}},
		{"contradicted int tag", "instances: !!int two\nrules: []\n",
			[]string{"1:12: cannot decode !!str `two` as a !!int"}},
		{"a key given twice after a bad value", "rules:\n  - name: r\n    tiers:\n    tiers: {by: header:X-Plan, default: {limit: 1/s}}\n",
			[]string{`3:11: tiers must be a mapping with by and a default tier`, `4:5: field "tiers" is given twice in rule (first at line 3)`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(c.doc), "w.yaml")
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("got %+v, %v; want a *config.Error", cfg, err)
			}
			var got []string
			for _, p := range ce.Problems {
				got = append(got, (&config.Error{Problems: []config.Problem{p}}).Error()[len("config:"):])
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("problems:\n got %q\nwant %q", got, c.want)
			}
		})
	}
}

// TestParseMergeKeys: a merged mapping's fields are read like the
// mapping's own, and its own win.
func TestParseMergeKeys(t *testing.T) {
	cfg, err := Parse([]byte("rules:\n  - &r {name: a, algorithm: gcra, burst: 5, on_error: deny, limit: 1/s}\n  - {<<: *r, name: b, burst: 7}\n"), "m.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Rules[1]
	if b.Name != "b" || b.Algorithm != "gcra" || b.Burst != 7 || b.OnError != "deny" || b.Limit != "1/s" {
		t.Fatalf("rule b = %+v", b)
	}
}
