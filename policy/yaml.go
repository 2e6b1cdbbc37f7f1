package policy

import (
	"bytes"
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// walker decodes a YAML node tree into a Config by hand, so that every
// problem, at any depth, is reported with its line and column and none
// stops the others from being found.
type walker struct {
	problems []Problem
	nodes    map[string]*yaml.Node // field path → its value node
	keys     map[string]*yaml.Node // field path → its key node
	bad      map[string]bool       // paths that already have a problem
	steps    int                   // nodes visited, to stop alias bombs
	tooBig   bool
}

// maxSteps bounds the nodes a document may expand to through aliases.
const maxSteps = 1_000_000

func newWalker() *walker {
	return &walker{nodes: map[string]*yaml.Node{}, keys: map[string]*yaml.Node{}, bad: map[string]bool{}}
}

// add records a problem at node n (nil: no position) for path.
func (w *walker) add(n *yaml.Node, path, msg string) {
	p := Problem{Path: path, Message: msg}
	if n != nil {
		p.Line, p.Column = n.Line, n.Column
	}
	w.problems = append(w.problems, p)
	if path != "" {
		w.bad[path] = true
	}
}

// addAt records a semantic problem for path at the closest recorded node.
func (w *walker) addAt(path, msg string) {
	for p := path; ; {
		if w.bad[p] {
			return // the decoder already said what is wrong here
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	pr := Problem{Path: path, Message: msg}
	for p := path; ; {
		if n := w.nodes[p]; n != nil {
			pr.Line, pr.Column = n.Line, n.Column
			break
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	// Semantic problems do not mark the path bad: several may apply.
	w.problems = append(w.problems, pr)
}

// keyAt records a problem at the key of path, falling back to its value.
func (w *walker) keyAt(path, msg string) {
	n := w.keys[path]
	if n == nil {
		w.addAt(path, msg)
		return
	}
	for p := path; ; {
		if w.bad[p] {
			return
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	w.problems = append(w.problems, Problem{Line: n.Line, Column: n.Column, Path: path, Message: msg})
}

// where describes path's position for "first at ..." messages.
func (w *walker) where(path string) string {
	if n := w.keys[path]; n != nil {
		return "line " + strconv.Itoa(n.Line)
	}
	if n := w.nodes[path]; n != nil {
		return "line " + strconv.Itoa(n.Line)
	}
	return path
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// document parses data and decodes its one document; nil on a syntax error.
func (w *walker) document(data []byte) *Config {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return &Config{} // an empty file: no rules
		}
		w.syntax(err)
		return nil
	}
	var second yaml.Node
	if err := dec.Decode(&second); err == nil {
		w.add(&second, "", "only one YAML document is allowed; remove the second \"---\"")
	} else if !errors.Is(err, io.EOF) {
		w.syntax(err)
	}
	cfg := &Config{}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	w.config(root, cfg)
	return cfg
}

func (w *walker) syntax(err error) {
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		w.problems = append(w.problems, Problem{Line: line, Message: "YAML syntax: " + m[2]})
		return
	}
	// yaml.v3 leaves the line out when the problem is on the first line.
	w.problems = append(w.problems, Problem{Line: 1, Message: "YAML syntax: " + strings.TrimPrefix(msg, "yaml: ")})
}

// deref follows aliases and counts the node against the budget.
func (w *walker) deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	w.steps++
	if w.steps > maxSteps && !w.tooBig {
		w.tooBig = true
		w.add(n, "", "the document expands to too many nodes through aliases")
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// describe names what a node is, for "got ..." messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return quote(n.Value)
	}
	return "an unsupported node"
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// lastName is the last field name of a path, for messages.
func lastName(path string) string {
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		path = path[i+1:]
	}
	if i := strings.IndexByte(path, '['); i >= 0 {
		path = path[:i]
	}
	return path
}

// field is one known key of a mapping.
type field struct {
	name string
	fn   func(path string, v *yaml.Node)
}

// pair is one key/value of a mapping, merges expanded.
type pair struct{ k, v *yaml.Node }

// pairs returns a mapping's entries with "<<" merge keys expanded: direct
// keys win over merged ones, as YAML specifies.
func (w *walker) pairs(n *yaml.Node, path string) []pair {
	if w.tooBig {
		return nil
	}
	var direct, merged []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := w.deref(n.Content[i]), n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			src := w.deref(v)
			var maps []*yaml.Node
			switch src.Kind {
			case yaml.MappingNode:
				maps = []*yaml.Node{src}
			case yaml.SequenceNode:
				for _, m := range src.Content {
					maps = append(maps, w.deref(m))
				}
			}
			for _, m := range maps {
				if m.Kind != yaml.MappingNode {
					w.add(k, path, "a merge (<<) needs a mapping or a list of mappings")
					continue
				}
				merged = append(merged, w.pairs(m, path)...)
			}
			continue
		}
		direct = append(direct, pair{k, v})
	}
	if len(merged) == 0 {
		return direct
	}
	seen := map[string]bool{}
	for _, p := range direct {
		seen[p.k.Value] = true
	}
	for _, p := range merged {
		if !seen[p.k.Value] {
			seen[p.k.Value] = true
			direct = append(direct, p)
		}
	}
	return direct
}

// mapping decodes a mapping node with the given known fields. what names
// the mapping in messages, such as "rule" or "store.redis". other, if set,
// receives keys that are not fields instead of an "unknown field" problem.
func (w *walker) mapping(n *yaml.Node, path, what string, fields []field, other func(key string, k, v *yaml.Node)) bool {
	n = w.deref(n)
	if isNull(n) {
		return false
	}
	if n.Kind != yaml.MappingNode {
		w.add(n, path, what+" must be a mapping, got "+describe(n))
		return false
	}
	first := map[string]*yaml.Node{}
	for _, p := range w.pairs(n, path) {
		if p.k.Kind != yaml.ScalarNode {
			w.add(p.k, path, "a key in "+what+" must be a plain name, got "+describe(p.k))
			continue
		}
		name := p.k.Value
		if f := first[name]; f != nil {
			w.add(p.k, join(path, name), "field "+quote(name)+" is given twice in "+what+" (first at line "+strconv.Itoa(f.Line)+")")
			continue
		}
		first[name] = p.k
		var fn func(string, *yaml.Node)
		for _, f := range fields {
			if f.name == name {
				fn = f.fn
				break
			}
		}
		if fn == nil {
			if other != nil {
				other(name, p.k, p.v)
				continue
			}
			w.add(p.k, join(path, name), unknownField(name, what, fields))
			continue
		}
		fp := join(path, name)
		w.keys[fp] = p.k
		v := w.deref(p.v)
		w.nodes[fp] = v
		fn(fp, v)
	}
	return true
}

// unknownField words an unknown-key problem, suggesting the closest name.
func unknownField(name, what string, fields []field) string {
	best, bestD := "", 3
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.name
		if d := editDistance(strings.ToLower(name), f.name); d < bestD {
			best, bestD = f.name, d
		}
	}
	msg := "unknown field " + quote(name) + " in " + what
	if best != "" {
		return msg + " (did you mean " + quote(best) + "?)"
	}
	return msg + " (want one of " + strings.Join(names, ", ") + ")"
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// str decodes a scalar as a string; null is "".
func (w *walker) str(path string, n *yaml.Node) string {
	if isNull(n) {
		return ""
	}
	if n.Kind != yaml.ScalarNode {
		w.add(n, path, lastName(path)+" must be a string, got "+describe(n))
		return ""
	}
	return n.Value
}

// boolean decodes true or false.
func (w *walker) boolean(path string, n *yaml.Node) bool {
	if isNull(n) {
		return false
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!bool" {
		b, err := strconv.ParseBool(n.Value)
		if err == nil {
			return b
		}
		return strings.EqualFold(n.Value, "true")
	}
	w.add(n, path, lastName(path)+" must be true or false, got "+describe(n))
	return false
}

// integer decodes a whole number no smaller than low.
func (w *walker) integer(path string, n *yaml.Node, low int64) int64 {
	if isNull(n) {
		return 0
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" {
		v, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
		if err == nil {
			if v < low {
				w.add(n, path, lastName(path)+" must be at least "+strconv.FormatInt(low, 10)+", got "+strconv.FormatInt(v, 10))
				return 0
			}
			return v
		}
	}
	w.add(n, path, lastName(path)+" must be a whole number, got "+describe(n))
	return 0
}

// ratio decodes a number from 0 to 1.
func (w *walker) ratio(path string, n *yaml.Node) float64 {
	if isNull(n) {
		return 0
	}
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!float" || n.Tag == "!!int") {
		v, err := strconv.ParseFloat(n.Value, 64)
		if err == nil && v > 0 && v <= 1 {
			return v
		}
	}
	w.add(n, path, lastName(path)+" must be a number above 0 and at most 1, got "+describe(n))
	return 0
}

// duration decodes a positive duration: a Go duration ("50ms", "1h30m")
// or a number of days ("7d").
func (w *walker) duration(path string, n *yaml.Node) time.Duration {
	if isNull(n) {
		return 0
	}
	if n.Kind != yaml.ScalarNode {
		w.add(n, path, lastName(path)+" must be a duration such as 500ms, 15m or 1h, got "+describe(n))
		return 0
	}
	d, msg := parseDuration(n.Value)
	if msg != "" {
		w.add(n, path, lastName(path)+" "+msg)
		return 0
	}
	return d
}

func parseDuration(s string) (time.Duration, string) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.ParseInt(days, 10, 64); err == nil {
			if n <= 0 || n > 36500 {
				return 0, "must be from 1d to 36500d, got " + quote(s)
			}
			return time.Duration(n) * 24 * time.Hour, ""
		}
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return 0, quote(s) + " has no unit (such as 500ms, 15m, 1h or 7d)"
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, quote(s) + " is not a duration (such as 500ms, 15m, 1h or 7d)"
	}
	if d <= 0 {
		return 0, "must be positive, got " + quote(s)
	}
	if d%time.Microsecond != 0 {
		return 0, quote(s) + " is not a whole number of microseconds"
	}
	return d, ""
}

// strList decodes a list of strings; a single string counts as a list of
// one when scalarOK.
func (w *walker) strList(path string, n *yaml.Node, scalarOK bool) []string {
	if isNull(n) {
		return nil
	}
	if n.Kind == yaml.ScalarNode && scalarOK {
		return []string{n.Value}
	}
	if n.Kind != yaml.SequenceNode {
		w.add(n, path, lastName(path)+" must be a list of strings, got "+describe(n))
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for i, e := range n.Content {
		e = w.deref(e)
		ip := index(path, i)
		w.nodes[ip] = e
		if e.Kind != yaml.ScalarNode || isNull(e) {
			w.add(e, ip, lastName(path)+" entries must be strings, got "+describe(e))
			out = append(out, "")
			continue
		}
		out = append(out, e.Value)
	}
	return out
}

// config decodes the top level.
func (w *walker) config(n *yaml.Node, c *Config) {
	w.mapping(n, "", "the top level", []field{
		{"store", func(p string, v *yaml.Node) { w.store(p, v, &c.Store) }},
		{"server", func(p string, v *yaml.Node) {
			w.mapping(v, p, "server", []field{
				{"http", func(p string, v *yaml.Node) { c.Server.HTTP = w.str(p, v) }},
				{"grpc", func(p string, v *yaml.Node) { c.Server.GRPC = w.str(p, v) }},
				{"admin_token_env", func(p string, v *yaml.Node) { c.Server.AdminTokenEnv = w.str(p, v) }},
			}, nil)
		}},
		{"trusted_proxies", func(p string, v *yaml.Node) { c.TrustedProxies = w.strList(p, v, false) }},
		{"headers", func(p string, v *yaml.Node) {
			w.mapping(v, p, "headers", []field{
				{"legacy", func(p string, v *yaml.Node) { c.Headers.Legacy = w.boolean(p, v) }},
			}, nil)
		}},
		{"shadow", func(p string, v *yaml.Node) { c.Shadow = w.boolean(p, v) }},
		{"instances", func(p string, v *yaml.Node) { c.Instances = int(w.integer(p, v, 1)) }},
		{"rules", func(p string, v *yaml.Node) { w.rules(p, v, c) }},
		{"allow", func(p string, v *yaml.Node) { c.Allow, c.AllowValues = w.list(p, v) }},
		{"deny", func(p string, v *yaml.Node) { c.Deny, c.DenyValues = w.list(p, v) }},
	}, nil)
}

func (w *walker) store(path string, n *yaml.Node, s *StoreConfig) {
	w.mapping(n, path, "store", []field{
		{"type", func(p string, v *yaml.Node) { s.Type = w.str(p, v) }},
		{"redis", func(p string, v *yaml.Node) {
			r := &s.Redis
			w.mapping(v, p, "store.redis", []field{
				{"addrs", func(p string, v *yaml.Node) { r.Addrs = w.strList(p, v, true) }},
				{"master_name", func(p string, v *yaml.Node) { r.MasterName = w.str(p, v) }},
				{"username", func(p string, v *yaml.Node) { r.Username = w.str(p, v) }},
				{"password", func(p string, v *yaml.Node) { r.Password = w.str(p, v) }},
				{"password_env", func(p string, v *yaml.Node) { r.PasswordEnv = w.str(p, v) }},
				{"tls", func(p string, v *yaml.Node) { r.TLS = w.boolean(p, v) }},
				{"db", func(p string, v *yaml.Node) { r.DB = int(w.integer(p, v, 0)) }},
				{"max_in_flight", func(p string, v *yaml.Node) { r.MaxInFlight = int(w.integer(p, v, 1)) }},
				{"max_batch", func(p string, v *yaml.Node) { r.MaxBatch = int(w.integer(p, v, 1)) }},
			}, nil)
		}},
		{"timeout", func(p string, v *yaml.Node) { s.Timeout = w.duration(p, v) }},
		{"on_error", func(p string, v *yaml.Node) { s.OnError = w.str(p, v) }},
		{"max_keys", func(p string, v *yaml.Node) { s.MaxKeys = int(w.integer(p, v, 1)) }},
		{"breaker", func(p string, v *yaml.Node) {
			b := &s.Breaker
			w.mapping(v, p, "store.breaker", []field{
				{"failures", func(p string, v *yaml.Node) { b.Failures = int(w.integer(p, v, 1)) }},
				{"failure_ratio", func(p string, v *yaml.Node) { b.FailureRatio = w.ratio(p, v) }},
				{"min_requests", func(p string, v *yaml.Node) { b.MinRequests = int(w.integer(p, v, 1)) }},
				{"window", func(p string, v *yaml.Node) { b.Window = w.duration(p, v) }},
				{"cooldown", func(p string, v *yaml.Node) { b.Cooldown = w.duration(p, v) }},
			}, nil)
		}},
	}, nil)
}

// list decodes allow or deny: CIDR strings and {identity, values}
// entries. The k-th CIDR's path is "allow[k]" and the k-th value list's
// "allow_values[k]", as in a Config built in Go.
func (w *walker) list(path string, n *yaml.Node) (cidrs []string, values []ValueList) {
	if isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		w.add(n, path, lastName(path)+" must be a list of CIDRs and {identity, values} entries, got "+describe(n))
		return nil, nil
	}
	for _, e := range n.Content {
		e = w.deref(e)
		switch {
		case e.Kind == yaml.ScalarNode && !isNull(e):
			w.nodes[index(path, len(cidrs))] = e
			cidrs = append(cidrs, e.Value)
		case e.Kind == yaml.MappingNode:
			var vl ValueList
			vp := index(path+"_values", len(values))
			w.nodes[vp] = e
			w.mapping(e, vp, path+" entry", []field{
				{"identity", func(p string, v *yaml.Node) { vl.Identity = w.str(p, v) }},
				{"values", func(p string, v *yaml.Node) { vl.Values = w.strList(p, v, false) }},
			}, nil)
			values = append(values, vl)
		default:
			w.add(e, "", path+" entries must be a CIDR or {identity, values}, got "+describe(e))
		}
	}
	return cidrs, values
}

func (w *walker) rules(path string, n *yaml.Node, c *Config) {
	if isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		w.add(n, path, "rules must be a list of rules, got "+describe(n))
		return
	}
	for i, e := range n.Content {
		e = w.deref(e)
		rp := index(path, i)
		w.nodes[rp] = e
		var r RuleConfig
		if e.Kind != yaml.MappingNode {
			w.add(e, rp, "a rule must be a mapping with a name, got "+describe(e))
		} else {
			w.rule(rp, e, &r)
		}
		c.Rules = append(c.Rules, r)
	}
}

func (w *walker) rule(path string, n *yaml.Node, r *RuleConfig) {
	w.mapping(n, path, "rule", []field{
		{"name", func(p string, v *yaml.Node) { r.Name = w.str(p, v) }},
		{"match", func(p string, v *yaml.Node) {
			m := &r.Match
			w.mapping(v, p, "match", []field{
				{"methods", func(p string, v *yaml.Node) { m.Methods = w.strList(p, v, true) }},
				{"path", func(p string, v *yaml.Node) { m.Path = w.str(p, v) }},
				{"host", func(p string, v *yaml.Node) { m.Host = w.str(p, v) }},
			}, nil)
		}},
		{"identity", func(p string, v *yaml.Node) { r.Identity = w.strList(p, v, true) }},
		{"on_missing", func(p string, v *yaml.Node) { r.OnMissing = w.str(p, v) }},
		{"limit", func(p string, v *yaml.Node) { r.Limit = w.str(p, v) }},
		{"algorithm", func(p string, v *yaml.Node) { r.Algorithm = w.str(p, v) }},
		{"burst", func(p string, v *yaml.Node) { r.Burst = w.integer(p, v, 1) }},
		{"block", func(p string, v *yaml.Node) { r.Block = w.duration(p, v) }},
		{"max_delay", func(p string, v *yaml.Node) { r.MaxDelay = w.duration(p, v) }},
		{"delay_after", func(p string, v *yaml.Node) { r.DelayAfter = w.integer(p, v, 1) }},
		{"tiers", func(p string, v *yaml.Node) { r.Tiers = w.tiers(p, v) }},
		{"shadow", func(p string, v *yaml.Node) { r.Shadow = w.boolean(p, v) }},
		{"on_error", func(p string, v *yaml.Node) { r.OnError = w.str(p, v) }},
	}, nil)
}

func (w *walker) tiers(path string, n *yaml.Node) *TiersConfig {
	t := &TiersConfig{}
	ok := w.mapping(n, path, "tiers", []field{
		{"by", func(p string, v *yaml.Node) { t.By = w.str(p, v) }},
	}, func(name string, k, v *yaml.Node) {
		tp := join(path, name)
		w.keys[tp] = k
		v = w.deref(v)
		w.nodes[tp] = v
		tc := TierConfig{Name: name}
		if v.Kind != yaml.MappingNode {
			w.add(v, tp, "tier "+quote(name)+" must be a mapping such as {limit: 100/m}, got "+describe(v))
		} else {
			w.mapping(v, tp, "tier "+quote(name), []field{
				{"limit", func(p string, v *yaml.Node) { tc.Limit = w.str(p, v) }},
				{"algorithm", func(p string, v *yaml.Node) { tc.Algorithm = w.str(p, v) }},
				{"burst", func(p string, v *yaml.Node) { tc.Burst = w.integer(p, v, 1) }},
				{"block", func(p string, v *yaml.Node) { tc.Block = w.duration(p, v) }},
				{"max_delay", func(p string, v *yaml.Node) { tc.MaxDelay = w.duration(p, v) }},
				{"delay_after", func(p string, v *yaml.Node) { tc.DelayAfter = w.integer(p, v, 1) }},
			}, nil)
		}
		t.Tiers = append(t.Tiers, tc)
	})
	if !ok && !w.bad[path] {
		w.add(w.nodes[path], path, "tiers must be a mapping with by and a default tier")
	}
	return t
}
