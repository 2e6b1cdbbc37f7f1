package yamlnode

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// decode returns the root of doc, failing the test on any error.
func decode(t *testing.T, doc string) *yaml.Node {
	t.Helper()
	root, err := Decode([]byte(doc))
	if err != nil {
		t.Fatalf("Decode(%q): %v", doc, err)
	}
	return root
}

// value returns the value of key in the top-level mapping of doc.
func value(t *testing.T, doc, key string) *yaml.Node {
	t.Helper()
	es, err := Mapping(decode(t, doc), Fields{What: "doc", Other: true})
	if err != nil {
		t.Fatal(err)
	}
	v := es.Get(key)
	if v == nil {
		t.Fatalf("%q has no %s", doc, key)
	}
	return v
}

func TestDecode(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		kind      error  // errors.Is
		want      string // the error, as Error renders it
		root      bool   // the root comes back along with the error
	}{
		{"empty", "", ErrEmpty, "yamlnode: no YAML document", false},
		{"comments only", "# nothing\n\n", ErrEmpty, "yamlnode: no YAML document", false},
		{"syntax", "a: [1, 2\nb: 3\n", ErrSyntax, "1: did not find expected ',' or ']'", false},
		{"syntax on the first line", "a: b: c\n", ErrSyntax, "mapping values are not allowed in this context", false}, // yaml.v3 gives no line
		{"second document", "a: 1\n---\nb: 2\n", ErrExtraDocument, "2:1: a second YAML document", true},
		{"syntax in the second document", "a: 1\n---\nb: [\n", ErrSyntax, "3: did not find expected node content", true},
		{"alias cycle", "a: &x\n  - b: *x\n", nil, "2:8: anchor 'x' value contains itself", false},
		{"merge cycle", "a: &x {<<: *x}\n", nil, "1:12: anchor 'x' value contains itself", false},
		{"contradicted tag", "a: !!bool yes\n", nil, "1:4: cannot decode !!str `yes` as a !!bool", false},
		{"empty int tag", "a: !!int\nb: 1\n", nil, "1:4: cannot decode !!null `` as a !!int", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			root, err := Decode([]byte(c.doc))
			if err == nil || err.Error() != c.want {
				t.Fatalf("Decode(%q) = %v, want %s", c.doc, err, c.want)
			}
			if c.kind != nil && !errors.Is(err, c.kind) {
				t.Fatalf("Decode(%q) = %v, not %v", c.doc, err, c.kind)
			}
			if (root != nil) != c.root {
				t.Fatalf("Decode(%q) root = %v, want one: %v", c.doc, root, c.root)
			}
		})
	}
	// Tags that agree with their value, and tags of weir's own, are fine.
	decode(t, "a: !!int 5\nb: !!str 5\nc: !!bool true\nd: !custom x\ne: !!float 1\n")
}

// TestDecodeAliasBomb: aliases that expand past MaxAliasNodes are refused
// at once, at the alias that crosses the bound, without being expanded.
func TestDecodeAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 12; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [", i, i)
		for j := range 10 {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("]\n")
	}
	_, err := Decode([]byte(b.String()))
	var e *Error
	if !errors.As(err, &e) || !strings.Contains(e.Msg, "the document expands to too many nodes through aliases") || e.Line != 6 {
		t.Fatalf("Decode(bomb) = %v, want too many nodes on line 6", err)
	}

	// Only what aliases add counts: up to the bound, and however long the
	// file itself is.
	defer func(n int) { maxAliasNodes = n }(maxAliasNodes)
	maxAliasNodes = 20
	decode(t, "a: &a [x, x, x]\nb: [*a, *a, *a, *a, *a]\n")
	decode(t, "l:\n"+strings.Repeat("  - [x, x, x, x, x, x, x, x, x, x]\n", 10))
	_, err = Decode([]byte("a: &a [x, x, x]\nb: [*a, *a, *a, *a, *a, *a]\n"))
	if !errors.As(err, &e) || e.Line != 2 || e.Column != 25 {
		t.Fatalf("past the bound: %v", err)
	}
}

func TestMapping(t *testing.T) {
	fields := Fields{What: "rule", Names: []string{"name", "limit", "algorithm"}, Hints: map[string]string{"unit": "unit belongs inside rate_limit"}}
	for _, c := range []struct {
		name, doc string
		want      []string // the problems, as Error renders them, with their Path
		entries   string   // the names of the entries returned
	}{
		{"fine", "name: a\nlimit: 5/m\n", nil, "name limit"},
		{"null", "~\n", nil, ""},
		{"suggestion", "name: a\nalgoritm: gcra\n", []string{`2:1: unknown field "algoritm" in rule (did you mean "algorithm"?) [algoritm]`}, "name"},
		{"suggestion in any case", "Limt: 1/s\n", []string{`1:1: unknown field "Limt" in rule (did you mean "limit"?) [Limt]`}, ""},
		{"no suggestion", "colour: red\n", []string{`1:1: unknown field "colour" in rule (want one of name, limit, algorithm) [colour]`}, ""},
		{"hint", "unit: second\n", []string{`1:1: unknown field "unit" in rule: unit belongs inside rate_limit [unit]`}, ""},
		{"given twice", "name: a\nlimit: 1/s\nname: b\n", []string{`3:1: field "name" is given twice in rule (first at line 1) [name]`}, "name limit"},
		{"key not a name", "[a]: 1\nname: x\n", []string{`1:1: a key in rule must be a plain name, got a list []`}, "name"},
		{"not a mapping", "[a, b]\n", []string{`1:1: rule must be a mapping, got a list []`}, ""},
		{"merge", "base: &b {name: a, limit: 1/s}\nr:\n  <<: *b\n  limit: 2/s\n", nil, "limit name"},
		{"merge of a list", "x: &x {name: a}\ny: &y {name: b, limit: 1/s}\nr: {<<: [*x, *y]}\n", nil, "name limit"},
		{"merge of a scalar", "r: {<<: 5, name: a}\n", []string{`1:5: a merge (<<) needs a mapping or a list of mappings []`}, "name"},
		{"merged key unknown", "b: &b {nme: a}\nr: {<<: *b, name: x}\n", []string{`1:8: unknown field "nme" in rule (did you mean "name"?) [nme]`}, "name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := decode(t, c.doc)
			if n.Kind == yaml.MappingNode && len(n.Content) > 0 && n.Content[len(n.Content)-2].Value == "r" {
				n = n.Content[len(n.Content)-1]
			}
			es, err := Mapping(n, fields)
			var got []string
			for _, e := range All(err) {
				got = append(got, e.Error()+" ["+e.Path+"]")
			}
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Fatalf("problems\n got  %q\n want %q", got, c.want)
			}
			var names []string
			for _, e := range es {
				names = append(names, e.Name)
			}
			if strings.Join(names, " ") != c.entries {
				t.Fatalf("entries %q, want %q", names, c.entries)
			}
		})
	}
	// Direct keys win over merged ones; the first merged mapping over later ones.
	es, err := Mapping(value(t, "x: &x {name: a, limit: 1/s}\ny: &y {name: b, algorithm: gcra}\nr: {<<: [*x, *y], limit: 2/s}\n", "r"), fields)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"name": "a", "limit": "2/s", "algorithm": "gcra"} {
		if v := es.Get(k); v == nil || v.Value != want {
			t.Errorf("%s = %v, want %s", k, v, want)
		}
	}
}

func TestReaders(t *testing.T) {
	type result struct {
		v   any
		err error
	}
	wrap := func(v any, err error) result { return result{v, err} }
	for _, c := range []struct {
		doc  string
		read func(*yaml.Node) result
		want any    // the value read
		err  string // or the error, as Error renders it
	}{
		{"v: abc", func(n *yaml.Node) result { return wrap(String(n, "v")) }, "abc", ""},
		{"v: 5", func(n *yaml.Node) result { return wrap(String(n, "v")) }, "5", ""},
		{"v: ~", func(n *yaml.Node) result { return wrap(String(n, "v")) }, "", ""},
		{"v: [a]", func(n *yaml.Node) result { return wrap(String(n, "v")) }, "", "1:4: v must be a single value, not a list"},
		{"v: true", func(n *yaml.Node) result { return wrap(Bool(n, "v")) }, true, ""},
		{"v: False", func(n *yaml.Node) result { return wrap(Bool(n, "v")) }, false, ""},
		{"v: yes", func(n *yaml.Node) result { return wrap(Bool(n, "v")) }, false, `1:4: v must be true or false, got "yes"`},
		{"v: yes", func(n *yaml.Node) result { return wrap(BoolYAML11(n, "v")) }, true, ""},
		{"v: Off", func(n *yaml.Node) result { return wrap(BoolYAML11(n, "v")) }, false, ""},
		{`v: "yes"`, func(n *yaml.Node) result { return wrap(BoolYAML11(n, "v")) }, false, `1:4: v must be true or false, got "yes"`},
		{"v: 1_000", func(n *yaml.Node) result { return wrap(Int(n, "v")) }, int64(1000), ""},
		{"v: 0x10", func(n *yaml.Node) result { return wrap(Int(n, "v")) }, int64(16), ""},
		{"v: 1.5", func(n *yaml.Node) result { return wrap(Int(n, "v")) }, int64(0), `1:4: v must be a whole number, got "1.5"`},
		{`v: "5"`, func(n *yaml.Node) result { return wrap(Int(n, "v")) }, int64(0), `1:4: v must be a whole number, got "5"`},
		{"v:", func(n *yaml.Node) result { return wrap(Int(n, "v")) }, int64(0), `1:3: v must be a whole number, got nothing`},
		{"v: 0", func(n *yaml.Node) result { return wrap(IntMin(n, "v", 1)) }, int64(0), "1:4: v must be at least 1, got 0"},
		{"v: 0.25", func(n *yaml.Node) result { return wrap(Ratio(n, "v")) }, 0.25, ""},
		{"v: 2", func(n *yaml.Node) result { return wrap(Ratio(n, "v")) }, 0.0, `1:4: v must be a number above 0 and at most 1, got "2"`},
		{"v: 1h30m", func(n *yaml.Node) result { return wrap(Duration(n, "v")) }, 90 * time.Minute, ""},
		{"v: 7d", func(n *yaml.Node) result { return wrap(Duration(n, "v")) }, 7 * 24 * time.Hour, ""},
		{"v: 15", func(n *yaml.Node) result { return wrap(Duration(n, "v")) }, time.Duration(0), `1:4: v "15" has no unit (such as 500ms, 15m, 1h or 7d)`},
		{"v: 15 minutes", func(n *yaml.Node) result { return wrap(Duration(n, "v")) }, time.Duration(0), `1:4: v "15 minutes" is not a duration (such as 500ms, 15m, 1h or 7d)`},
		{"v: 1ns", func(n *yaml.Node) result { return wrap(Duration(n, "v")) }, time.Duration(0), `1:4: v "1ns" is not a whole number of microseconds`},
		{"v: 0d", func(n *yaml.Node) result { return wrap(Duration(n, "v")) }, time.Duration(0), `1:4: v must be from 1d to 36500d, got "0d"`},
		{"v: {a: 1}", func(n *yaml.Node) result { return wrap(Duration(n, "v")) }, time.Duration(0), "1:4: v must be a duration such as 500ms, 15m or 1h, got a mapping"},
	} {
		r := c.read(value(t, c.doc, "v"))
		got := ""
		if r.err != nil {
			got = r.err.Error()
			var e *Error
			if !errors.As(r.err, &e) {
				t.Errorf("%s: the error %T is not an *Error", c.doc, r.err)
			}
		}
		if got != c.err || r.v != c.want {
			t.Errorf("%s: got %v, %q; want %v, %q", c.doc, r.v, got, c.want, c.err)
		}
	}
}

func TestStrings(t *testing.T) {
	vs, nodes, err := Strings(value(t, "v: [a, [b], c, ~]", "v"), "v", false)
	if strings.Join(vs, ",") != "a,,c," || len(nodes) != 4 || nodes[2].Value != "c" {
		t.Fatalf("Strings = %q, %v", vs, nodes)
	}
	es := All(err)
	if len(es) != 2 || es[0].Error() != "1:8: v entries must be strings, got a list" || es[0].Path != "[1]" || es[1].Path != "[3]" {
		t.Fatalf("problems %v", err)
	}
	if vs, _, err := Strings(value(t, "v: a", "v"), "v", true); err != nil || len(vs) != 1 || vs[0] != "a" {
		t.Fatalf("one string as a list: %q, %v", vs, err)
	}
	if _, _, err := Strings(value(t, "v: a", "v"), "v", false); err == nil || err.Error() != `1:4: v must be a list of strings, got "a"` {
		t.Fatalf("one string where a list belongs: %v", err)
	}
}

func TestSuggest(t *testing.T) {
	names := []string{"rules", "store", "default"}
	for in, want := range map[string]string{"rulez": "rules", "RULES": "rules", "stor": "store", "defualt": "default", "colour": "", "": ""} {
		if got := Suggest(in, names); got != want {
			t.Errorf("Suggest(%q) = %q, want %q", in, got, want)
		}
	}
}
