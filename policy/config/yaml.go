package config

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/weir-dev/weir/internal/yamlnode"
	"github.com/weir-dev/weir/protect"
)

// walker decodes a YAML node tree into a Config, so that every problem,
// at any depth, is reported with its line and column and none stops the
// others from being found. internal/yamlnode reads the nodes; the walker
// collects its problems and remembers where each field is, for the
// problems check finds later.
type walker struct {
	problems []Problem
	nodes    map[string]*yaml.Node // field path → its value node
	keys     map[string]*yaml.Node // field path → its key node
	bad      map[string]bool       // paths that already have a problem
}

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

// fail records the problems of err, from internal/yamlnode, found while
// reading path.
func (w *walker) fail(path string, err error) {
	for _, e := range yamlnode.All(err) {
		p := path
		switch {
		case e.Path == "":
		case strings.HasPrefix(e.Path, "["):
			p += e.Path
		default:
			p = join(path, e.Path)
		}
		w.problems = append(w.problems, Problem{Line: e.Line, Column: e.Column, Path: p, Message: e.Msg})
		if p != "" {
			w.bad[p] = true
		}
	}
}

// read reads the value at path with a yamlnode reader, recording its
// problem.
func read[T any](w *walker, path string, n *yaml.Node, reader func(*yaml.Node, string) (T, error)) T {
	v, err := reader(n, lastName(path))
	w.fail(path, err)
	return v
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

// emptyConfig is the problem of a file with no content: it is refused on
// every path (first load, file watch, SIGHUP, Reload) rather than taken for
// an empty rule set.
const emptyConfig = "the file is empty (or holds only comments or null); a config caught mid-write would drop every rule, so an empty rule set must be written out: rules: []"

// document parses data and decodes its one document; nil when there is
// nothing to decode.
func (w *walker) document(data []byte) *Config {
	root, err := yamlnode.Decode(data)
	if errors.Is(err, yamlnode.ErrEmpty) {
		// Nothing but blanks and comments. Most often a file caught
		// mid-rewrite (truncated, not yet written): taking it for "no
		// rules" would lift every limit, so it must say so.
		w.add(nil, "", emptyConfig)
		return nil
	}
	for _, e := range yamlnode.All(err) {
		switch {
		case errors.Is(e, yamlnode.ErrExtraDocument):
			e.Msg = "only one YAML document is allowed; remove the second \"---\""
		case errors.Is(e, yamlnode.ErrSyntax):
			e.Line = syntaxLine(data, e)
			if strings.Contains(e.Msg, "found a tab character") {
				e.Msg += " (indent with spaces: YAML does not allow tabs)"
			}
			e.Msg = "YAML syntax: " + e.Msg
			e.Line = max(e.Line, 1) // yaml.v3 leaves the line out when the problem is on the first line
		}
		w.fail("", e)
	}
	if root == nil {
		return nil
	}
	if yamlnode.IsNull(root) {
		w.add(root, "", emptyConfig)
		return nil
	}
	cfg := &Config{}
	w.config(root, cfg)
	return cfg
}

// maxRelocateLines bounds the files syntaxLine reads again line by line.
const maxRelocateLines = 5000

// syntaxLine returns the line at fault of the syntax error e in data.
// yaml.v3 reports an indentation error at the start of the block it was
// parsing ("rules:", the rule's "- name:"), not at the line that breaks
// it, so this returns the first line, from that one on, at which the file
// read up to there fails the same way; e.Line when none does.
func syntaxLine(data []byte, e *yamlnode.Error) int {
	lines := strings.SplitAfter(string(data), "\n")
	if e.Line < 1 || len(lines) > maxRelocateLines {
		return e.Line
	}
	end := 0
	for n, l := range lines {
		end += len(l)
		if n+2 < e.Line { // from the line before the one reported on
			continue
		}
		_, err := yamlnode.Decode(data[:end])
		for _, pe := range yamlnode.All(err) {
			if errors.Is(pe, yamlnode.ErrSyntax) && pe.Msg == e.Msg {
				return n + 1
			}
		}
	}
	return e.Line
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

// mapping decodes a mapping node with the given known fields. what names
// the mapping in messages, such as "rule" or "store.redis". other, if set,
// receives keys that are not fields instead of an "unknown field" problem.
// It reports whether n is a mapping.
func (w *walker) mapping(n *yaml.Node, path, what string, fields []field, other func(key string, k, v *yaml.Node)) bool {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.name
	}
	entries, err := yamlnode.Mapping(n, yamlnode.Fields{What: what, Names: names, Other: other != nil})
	// Problems with keys are recorded once the fields are decoded: a key
	// given twice must not mark its path bad before its first value has
	// been read and checked.
	defer w.fail(path, err)
	if n = yamlnode.Resolve(n); yamlnode.IsNull(n) || n.Kind != yaml.MappingNode {
		return false
	}
	for _, e := range entries {
		i := slices.Index(names, e.Name)
		if i < 0 {
			other(e.Name, e.Key, e.Value)
			continue
		}
		fp := join(path, e.Name)
		w.keys[fp] = e.Key
		w.nodes[fp] = e.Value
		fields[i].fn(fp, e.Value)
	}
	return true
}

// The readers of one value: each records its problem. An empty value
// ("key:" with nothing) leaves the field unset.

func (w *walker) str(path string, n *yaml.Node) string { return read(w, path, n, yamlnode.String) }

func (w *walker) boolean(path string, n *yaml.Node) bool { return read(w, path, n, yamlnode.Bool) }

// integer decodes a whole number no smaller than low.
func (w *walker) integer(path string, n *yaml.Node, low int64) int64 {
	if yamlnode.IsNull(n) {
		return 0
	}
	return read(w, path, n, func(n *yaml.Node, name string) (int64, error) { return yamlnode.IntMin(n, name, low) })
}

func (w *walker) ratio(path string, n *yaml.Node) float64 {
	if yamlnode.IsNull(n) {
		return 0
	}
	return read(w, path, n, yamlnode.Ratio)
}

func (w *walker) duration(path string, n *yaml.Node) time.Duration {
	if yamlnode.IsNull(n) {
		return 0
	}
	return read(w, path, n, yamlnode.Duration)
}

// durationOrZero decodes a duration that may also be zero: 0 or 0s.
func (w *walker) durationOrZero(path string, n *yaml.Node) time.Duration {
	if r := yamlnode.Resolve(n); r.Kind == yaml.ScalarNode && (r.Value == "0" || r.Value == "0s") {
		return 0
	}
	return w.duration(path, n)
}

// blocks decodes block: one duration, or a list of them (escalating
// penalty boxes), whose first is returned as the single box too.
func (w *walker) blocks(path string, n *yaml.Node) (time.Duration, []time.Duration) {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.SequenceNode {
		return w.duration(path, n), nil
	}
	if len(n.Content) == 0 {
		w.add(n, path, "block list is empty: write one box (block: 1m) or boxes that grow ([1m, 10m, 1h])")
		return 0, nil
	}
	out := make([]time.Duration, len(n.Content))
	for i, e := range n.Content {
		e = yamlnode.Resolve(e)
		ip := index(path, i)
		w.nodes[ip] = e
		out[i] = w.duration(ip, e)
	}
	return out[0], out
}

// strList decodes a list of strings; a single string counts as a list of
// one when scalarOK.
func (w *walker) strList(path string, n *yaml.Node, scalarOK bool) []string {
	out, nodes, err := yamlnode.Strings(n, lastName(path), scalarOK)
	for i, e := range nodes {
		w.nodes[index(path, i)] = e
	}
	w.fail(path, err)
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
				{"tls", func(p string, v *yaml.Node) {
					t := &c.Server.TLS
					w.mapping(v, p, "server.tls", []field{
						{"cert", func(p string, v *yaml.Node) { t.Cert = w.str(p, v) }},
						{"key", func(p string, v *yaml.Node) { t.Key = w.str(p, v) }},
						{"client_ca", func(p string, v *yaml.Node) { t.ClientCA = w.str(p, v) }},
					}, nil)
				}},
				{"auth_headers", func(p string, v *yaml.Node) { c.Server.AuthHeaders = w.str(p, v) }},
				{"envoy_max_override_period", func(p string, v *yaml.Node) { c.Server.EnvoyMaxOverridePeriod = w.duration(p, v) }},
				{"resp", func(p string, v *yaml.Node) {
					r := &c.Server.RESP
					w.mapping(v, p, "server.resp", []field{
						{"addr", func(p string, v *yaml.Node) { r.Addr = w.str(p, v) }},
						{"token", func(p string, v *yaml.Node) { r.Token = w.str(p, v) }},
						{"tls", func(p string, v *yaml.Node) { on := w.boolean(p, v); r.TLS = &on }},
					}, nil)
				}},
			}, nil)
		}},
		{"trusted_proxies", func(p string, v *yaml.Node) { c.TrustedProxies = w.strList(p, v, false) }},
		{"client_ip_header", func(p string, v *yaml.Node) { c.ClientIPHeader = w.str(p, v) }},
		{"headers", func(p string, v *yaml.Node) {
			w.mapping(v, p, "headers", []field{
				{"legacy", func(p string, v *yaml.Node) { c.Headers.Legacy = w.boolean(p, v) }},
			}, nil)
		}},
		{"shadow", func(p string, v *yaml.Node) { c.Shadow = w.boolean(p, v) }},
		{"near_limit", func(p string, v *yaml.Node) { c.NearLimit = w.str(p, v) }},
		{"instances", func(p string, v *yaml.Node) {
			if v.Kind == yaml.ScalarNode && v.Value == InstancesAuto {
				c.InstancesAuto = true
				return
			}
			c.Instances = int(w.integer(p, v, 1))
		}},
		{"instances_floor", func(p string, v *yaml.Node) { c.InstancesFloor = int(w.integer(p, v, 1)) }},
		{"rules", func(p string, v *yaml.Node) { w.rules(p, v, c) }},
		{"protect", func(p string, v *yaml.Node) { w.protects(p, v, c) }},
		{"system", func(p string, v *yaml.Node) {
			s := &c.System
			w.mapping(v, p, "system", []field{
				{"max_cpu", func(p string, v *yaml.Node) { s.MaxCPU = w.str(p, v) }},
				{"max_inflight", func(p string, v *yaml.Node) { s.MaxInFlight = int(w.integer(p, v, 1)) }},
			}, nil)
		}},
		{"allow", func(p string, v *yaml.Node) { c.Allow, c.AllowValues = w.list(p, v) }},
		{"deny", func(p string, v *yaml.Node) { c.Deny, c.DenyValues = w.list(p, v) }},
		{"prices", func(p string, v *yaml.Node) { c.Prices = w.prices(p, v) }},
		{"events", func(p string, v *yaml.Node) {
			w.mapping(v, p, "events", []field{
				{"webhook", func(p string, v *yaml.Node) { c.EventWebhook = w.str(p, v) }},
				{"secret_env", func(p string, v *yaml.Node) { c.EventSecretEnv = w.str(p, v) }},
				{"secret_file", func(p string, v *yaml.Node) { c.EventSecretFile = w.str(p, v) }},
				{"thresholds", func(p string, v *yaml.Node) { c.EventThresholds = w.thresholds(p, v) }},
			}, nil)
		}},
	}, nil)
}

// thresholds decodes a list of shares of a limit: 0.8 or "80%".
func (w *walker) thresholds(path string, n *yaml.Node) []float64 {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.SequenceNode {
		w.add(n, path, "thresholds must be a list of shares of the limit, such as [0.8, 0.95, 1.0] or [80%, 100%], got "+yamlnode.Describe(n))
		return nil
	}
	out := make([]float64, 0, len(n.Content))
	for i, e := range n.Content {
		e = yamlnode.Resolve(e)
		ip := index(path, i)
		w.nodes[ip] = e
		if e.Kind == yaml.ScalarNode {
			if pc, ok := strings.CutSuffix(e.Value, "%"); ok {
				if v, err := strconv.ParseFloat(pc, 64); err == nil && v > 0 && v <= 100 {
					out = append(out, v/100)
					continue
				}
				w.add(e, ip, fmt.Sprintf("threshold %q must be a share of the limit above 0 and at most 100%%", e.Value))
				continue
			}
		}
		out = append(out, w.ratio(ip, e))
	}
	return out
}

// ruleEvents decodes a rule's events: on/off, or {thresholds, webhook}.
func (w *walker) ruleEvents(path string, n *yaml.Node, r *RuleConfig) {
	n = yamlnode.Resolve(n)
	if n.Kind == yaml.ScalarNode {
		r.Events = w.boolean(path, n)
		return
	}
	r.Events = true
	w.mapping(n, path, "events", []field{
		{"thresholds", func(p string, v *yaml.Node) { r.EventThresholds = w.thresholds(p, v) }},
		{"webhook", func(p string, v *yaml.Node) { r.EventWebhook = w.str(p, v) }},
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
				{"tls_ca", func(p string, v *yaml.Node) { r.TLSCA = w.str(p, v) }},
				{"tls_cert", func(p string, v *yaml.Node) { r.TLSCert = w.str(p, v) }},
				{"tls_key", func(p string, v *yaml.Node) { r.TLSKey = w.str(p, v) }},
				{"tls_server_name", func(p string, v *yaml.Node) { r.TLSServerName = w.str(p, v) }},
				{"db", func(p string, v *yaml.Node) { r.DB = int(w.integer(p, v, 0)) }},
				{"max_in_flight", func(p string, v *yaml.Node) { r.MaxInFlight = int(w.integer(p, v, 1)) }},
				{"max_batch", func(p string, v *yaml.Node) { r.MaxBatch = int(w.integer(p, v, 1)) }},
				{"linger", func(p string, v *yaml.Node) { d := w.durationOrZero(p, v); r.Linger = &d }},
				{"prefix", func(p string, v *yaml.Node) { r.Prefix = w.str(p, v) }},
			}, nil)
		}},
		{"timeout", func(p string, v *yaml.Node) { s.Timeout = w.duration(p, v) }},
		{"on_error", func(p string, v *yaml.Node) { s.OnError = w.str(p, v) }},
		{"max_keys", func(p string, v *yaml.Node) { s.MaxKeys = int(w.integer(p, v, 1)) }},
		{"deny_cache", func(p string, v *yaml.Node) { on := w.boolean(p, v); s.DenyCache = &on }},
		{"deny_cache_size", func(p string, v *yaml.Node) { s.DenyCacheSize = int(w.integer(p, v, 1)) }},
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
	if yamlnode.IsNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		w.add(n, path, lastName(path)+" must be a list of CIDRs and {identity, values} entries, got "+yamlnode.Describe(n))
		return nil, nil
	}
	for _, e := range n.Content {
		e = yamlnode.Resolve(e)
		switch {
		case e.Kind == yaml.ScalarNode && !yamlnode.IsNull(e):
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
			w.add(e, "", path+" entries must be a CIDR or {identity, values}, got "+yamlnode.Describe(e))
		}
	}
	return cidrs, values
}

func (w *walker) rules(path string, n *yaml.Node, c *Config) {
	w.namedList(path, n, "rules", "rule", func(rp string, e *yaml.Node) {
		var r RuleConfig
		if e != nil {
			w.rule(rp, e, &r)
		}
		c.Rules = append(c.Rules, r)
	})
}

// namedList walks a list of mappings that each have a name (rules,
// protect rules): each is called with an entry's path and its mapping, or
// nil for an entry that is no mapping (reported here), so that positions
// stay in step with the list.
func (w *walker) namedList(path string, n *yaml.Node, list, what string, each func(rp string, e *yaml.Node)) {
	if yamlnode.IsNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		w.add(n, path, list+" must be a list of "+what+"s, got "+yamlnode.Describe(n))
		return
	}
	for i, e := range n.Content {
		e = yamlnode.Resolve(e)
		rp := index(path, i)
		w.nodes[rp] = e
		if e.Kind != yaml.MappingNode {
			w.add(e, rp, "a "+what+" must be a mapping with a name, got "+yamlnode.Describe(e))
			each(rp, nil)
			continue
		}
		each(rp, e)
	}
}

// match reads a rule's or a protect rule's match: mapping into m.
func (w *walker) match(p string, v *yaml.Node, m *MatchConfig) {
	w.mapping(v, p, "match", []field{
		{"methods", func(p string, v *yaml.Node) { m.Methods = w.strList(p, v, true) }},
		{"path", func(p string, v *yaml.Node) { m.Path = w.str(p, v) }},
		{"host", func(p string, v *yaml.Node) { m.Host = w.str(p, v) }},
	}, nil)
}

func (w *walker) rule(path string, n *yaml.Node, r *RuleConfig) {
	w.mapping(n, path, "rule", []field{
		{"name", func(p string, v *yaml.Node) { r.Name = w.str(p, v) }},
		{"match", func(p string, v *yaml.Node) { w.match(p, v, &r.Match) }},
		{"identity", func(p string, v *yaml.Node) { r.Identity = w.strList(p, v, true) }},
		{"on_missing", func(p string, v *yaml.Node) { r.OnMissing = w.str(p, v) }},
		{"limit", func(p string, v *yaml.Node) { r.Limit = w.str(p, v) }},
		{"algorithm", func(p string, v *yaml.Node) { r.Algorithm = w.str(p, v) }},
		{"burst", func(p string, v *yaml.Node) { r.Burst = w.integer(p, v, 1) }},
		{"block", func(p string, v *yaml.Node) { r.Block, r.BlockList = w.blocks(p, v) }},
		{"forget_after", func(p string, v *yaml.Node) { r.ForgetAfter = w.duration(p, v) }},
		{"timezone", func(p string, v *yaml.Node) { r.Timezone = w.str(p, v) }},
		{"reset_at", func(p string, v *yaml.Node) { r.ResetAt = w.str(p, v) }},
		{"warmup", func(p string, v *yaml.Node) { r.Warmup = w.duration(p, v) }},
		{"max_delay", func(p string, v *yaml.Node) { r.MaxDelay = w.duration(p, v) }},
		{"delay_after", func(p string, v *yaml.Node) { r.DelayAfter = w.integer(p, v, 1) }},
		{"buckets", func(p string, v *yaml.Node) { r.Buckets = w.integer(p, v, 1) }},
		{"tiers", func(p string, v *yaml.Node) { r.Tiers = w.tiers(p, v) }},
		{"shadow", func(p string, v *yaml.Node) { r.Shadow = w.boolean(p, v) }},
		{"near_limit", func(p string, v *yaml.Node) { r.NearLimit = w.str(p, v) }},
		{"on_error", func(p string, v *yaml.Node) { r.OnError = w.str(p, v) }},
		{"local_budget", func(p string, v *yaml.Node) { w.localBudget(p, v, r, "local_budget") }},
		{"lease", func(p string, v *yaml.Node) { w.localBudget(p, v, r, "lease") }},
		{"cost", func(p string, v *yaml.Node) { r.Cost = w.scalar(p, v) }},
		{"count", func(p string, v *yaml.Node) { r.Count = w.count(p, v) }},
		{"budget", func(p string, v *yaml.Node) { r.Budget = w.str(p, v) }},
		{"cost_expr", func(p string, v *yaml.Node) { r.CostExpr = w.str(p, v) }},
		{"events", func(p string, v *yaml.Node) { w.ruleEvents(p, v, r) }},
	}, nil)
}

// localBudget decodes a rule's local_budget, or lease, its former name
// (a lease is a concurrency slot now), which still works; a rule giving
// both is told which to keep.
func (w *walker) localBudget(p string, v *yaml.Node, r *RuleConfig, key string) {
	if r.budgetKey != "" {
		w.add(v, p, "lease is the former name of local_budget; give local_budget alone")
		return
	}
	r.LocalBudget, r.budgetKey = w.integer(p, v, 1), key
}

// scalar decodes any scalar (a string or a number) as written.
func (w *walker) scalar(path string, n *yaml.Node) string {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.ScalarNode || yamlnode.IsNull(n) {
		w.add(n, path, lastName(path)+" must be a string or a number, got "+yamlnode.Describe(n))
		return ""
	}
	return n.Value
}

// count decodes a rule's count: {status: [401, 403]}.
func (w *walker) count(path string, n *yaml.Node) *CountConfig {
	c := &CountConfig{}
	w.mapping(n, path, "count", []field{
		{"status", func(p string, v *yaml.Node) {
			v = yamlnode.Resolve(v)
			if v.Kind != yaml.SequenceNode {
				w.add(v, p, "status must be a list of HTTP statuses such as [401, 403], got "+yamlnode.Describe(v))
				return
			}
			for i, e := range v.Content {
				c.Status = append(c.Status, int(w.integer(fmt.Sprintf("%s[%d]", p, i), e, 100)))
			}
		}},
	}, nil)
	return c
}

func (w *walker) tiers(path string, n *yaml.Node) *TiersConfig {
	t := &TiersConfig{}
	ok := w.mapping(n, path, "tiers", []field{
		{"by", func(p string, v *yaml.Node) { t.By = w.str(p, v) }},
	}, func(name string, k, v *yaml.Node) {
		tp := join(path, name)
		w.keys[tp] = k
		v = yamlnode.Resolve(v)
		w.nodes[tp] = v
		tc := TierConfig{Name: name}
		if v.Kind != yaml.MappingNode {
			w.add(v, tp, "tier "+quote(name)+" must be a mapping such as {limit: 100/m}, got "+yamlnode.Describe(v))
		} else {
			w.mapping(v, tp, "tier "+quote(name), []field{
				{"limit", func(p string, v *yaml.Node) { tc.Limit = w.str(p, v) }},
				{"algorithm", func(p string, v *yaml.Node) { tc.Algorithm = w.str(p, v) }},
				{"burst", func(p string, v *yaml.Node) { tc.Burst = w.integer(p, v, 1) }},
				{"block", func(p string, v *yaml.Node) { tc.Block = w.duration(p, v) }},
				{"max_delay", func(p string, v *yaml.Node) { tc.MaxDelay = w.duration(p, v) }},
				{"delay_after", func(p string, v *yaml.Node) { tc.DelayAfter = w.integer(p, v, 1) }},
				{"buckets", func(p string, v *yaml.Node) { tc.Buckets = w.integer(p, v, 1) }},
			}, nil)
		}
		t.Tiers = append(t.Tiers, tc)
	})
	if !ok && !w.bad[path] {
		w.add(w.nodes[path], path, "tiers must be a mapping with by and a default tier")
	}
	return t
}

func (w *walker) protects(path string, n *yaml.Node, c *Config) {
	w.namedList(path, n, "protect", "protect rule", func(rp string, e *yaml.Node) {
		var pc ProtectConfig
		if e != nil {
			w.protect(rp, e, &pc)
		}
		c.Protect = append(c.Protect, pc)
	})
}

func (w *walker) protect(path string, n *yaml.Node, pc *ProtectConfig) {
	w.mapping(n, path, "protect rule", []field{
		{"name", func(p string, v *yaml.Node) { pc.Name = w.str(p, v) }},
		{"match", func(p string, v *yaml.Node) { w.match(p, v, &pc.Match) }},
		{"concurrency", func(p string, v *yaml.Node) {
			if r := yamlnode.Resolve(v); r.Kind == yaml.ScalarNode && r.Value == "adaptive" {
				pc.Adaptive = true
				return
			}
			pc.Concurrency = int(read(w, p, v, func(n *yaml.Node, _ string) (int64, error) {
				x, err := yamlnode.IntMin(n, "concurrency", 1)
				if err != nil {
					return 0, yamlnode.Errorf(yamlnode.Resolve(n), "concurrency must be adaptive or a number of requests in flight of at least 1, got %s", yamlnode.Describe(n))
				}
				return x, nil
			}))
		}},
		{"min_concurrency", func(p string, v *yaml.Node) { pc.MinConcurrency = int(w.integer(p, v, 1)) }},
		{"max_concurrency", func(p string, v *yaml.Node) { pc.MaxConcurrency = int(w.integer(p, v, 1)) }},
		{"priority", func(p string, v *yaml.Node) { pc.Priority = w.str(p, v) }},
		{"reserve", func(p string, v *yaml.Node) { pc.Reserve = w.str(p, v) }},
		{"max_wait", func(p string, v *yaml.Node) { pc.MaxWait = w.duration(p, v) }},
		{"shadow", func(p string, v *yaml.Node) { pc.Shadow = w.boolean(p, v) }},
		{"breaker", func(p string, v *yaml.Node) {
			b := &protect.BreakerConfig{}
			pc.Breaker = b
			w.mapping(v, p, "breaker", []field{
				{"slow_call", func(p string, v *yaml.Node) { b.SlowCall = w.duration(p, v) }},
				{"slow_ratio", func(p string, v *yaml.Node) { b.SlowRatio = w.number(p, v) }},
				{"error_ratio", func(p string, v *yaml.Node) { b.ErrorRatio = w.number(p, v) }},
				{"errors", func(p string, v *yaml.Node) { b.Errors = int(w.integer(p, v, 0)) }},
				{"min_requests", func(p string, v *yaml.Node) { b.MinRequests = int(w.integer(p, v, 1)) }},
				{"window", func(p string, v *yaml.Node) { b.Window = w.duration(p, v) }},
				{"open_for", func(p string, v *yaml.Node) { b.OpenFor = w.duration(p, v) }},
				{"probes", func(p string, v *yaml.Node) { b.Probes = int(w.integer(p, v, 1)) }},
			}, nil)
		}},
	}, nil)
}

// number decodes a number; its range is checked later.
func (w *walker) number(path string, n *yaml.Node) float64 {
	if yamlnode.IsNull(n) {
		return 0
	}
	return read(w, path, n, func(n *yaml.Node, name string) (float64, error) {
		n = yamlnode.Resolve(n)
		if n.Kind == yaml.ScalarNode && (n.Tag == "!!float" || n.Tag == "!!int") {
			if v, err := strconv.ParseFloat(n.Value, 64); err == nil {
				return v, nil
			}
		}
		return 0, yamlnode.Errorf(n, "%s must be a number, got %s", name, yamlnode.Describe(n))
	})
}
