package yamlnode

import (
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Fields describes the keys a mapping may hold.
type Fields struct {
	// What names the mapping in messages, such as "rule" or "the top level".
	What string
	// Names are the known keys, in the order messages list them.
	Names []string
	// Hints explain keys that are not in Names but that belong elsewhere,
	// such as "unit belongs inside rate_limit"; such a key gets its hint
	// rather than a suggestion.
	Hints map[string]string
	// Other lets keys that are not in Names through as entries (a mapping
	// keyed by names of the user's choosing), instead of refusing them.
	Other bool
}

// Entry is one key of a mapping and its value.
type Entry struct {
	Name  string
	Key   *yaml.Node
	Value *yaml.Node // aliases followed
}

// Entries are the entries of a mapping, in document order.
type Entries []Entry

// Get returns the value of key name, or nil when it is absent.
func (es Entries) Get(name string) *yaml.Node {
	for _, e := range es {
		if e.Name == name {
			return e.Value
		}
	}
	return nil
}

// Mapping returns the entries of mapping n, merge keys (<<) expanded with
// the mapping's own keys winning, as YAML specifies. Null is a mapping with
// no entries. A node that is not a mapping is an *Error; the entries whose
// key is not a plain name, is given twice or is not in f (unless f.Other)
// are left out and reported in an Errors, each at its key and with the key
// as its Path, while the rest are returned.
func Mapping(n *yaml.Node, f Fields) (Entries, error) {
	n = Resolve(n)
	if IsNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, Errorf(n, "%s must be a mapping, got %s", f.What, Describe(n))
	}
	var errs Errors
	var out Entries
	first := map[string]*yaml.Node{}
	for _, p := range pairs(n, &errs) {
		if p.k.Kind != yaml.ScalarNode {
			errs = append(errs, Errorf(p.k, "a key in %s must be a plain name, got %s", f.What, Describe(p.k)))
			continue
		}
		name := p.k.Value
		if prev := first[name]; prev != nil {
			e := Errorf(p.k, "field %s is given twice in %s (first at line %d)", strconv.Quote(name), f.What, prev.Line)
			e.Path = name
			errs = append(errs, e)
			continue
		}
		first[name] = p.k
		if !f.Other && !slices.Contains(f.Names, name) {
			e := Errorf(p.k, "%s", f.unknown(name))
			e.Path = name
			errs = append(errs, e)
			continue
		}
		out = append(out, Entry{Name: name, Key: p.k, Value: Resolve(p.v)})
	}
	return out, errs.err()
}

// unknown words an unknown-key problem: with the key's hint, else with
// the closest known name, else with the names it may be.
func (f Fields) unknown(name string) string {
	msg := "unknown field " + strconv.Quote(name) + " in " + f.What
	if hint, ok := f.Hints[name]; ok {
		return msg + ": " + hint
	}
	if best := Suggest(name, f.Names); best != "" {
		return msg + " (did you mean " + strconv.Quote(best) + "?)"
	}
	return msg + " (want one of " + strings.Join(f.Names, ", ") + ")"
}

// pair is one key and value of a mapping.
type pair struct{ k, v *yaml.Node }

// pairs returns a mapping's pairs with "<<" merge keys expanded: direct
// keys win over merged ones, and earlier merged mappings over later ones.
// Decode has bounded what aliases expand to, so this terminates.
func pairs(n *yaml.Node, errs *Errors) []pair {
	var direct, merged []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := Resolve(n.Content[i]), n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			src := Resolve(v)
			var maps []*yaml.Node
			switch src.Kind {
			case yaml.MappingNode:
				maps = []*yaml.Node{src}
			case yaml.SequenceNode:
				for _, m := range src.Content {
					maps = append(maps, Resolve(m))
				}
			default:
				maps = []*yaml.Node{src}
			}
			for _, m := range maps {
				if m.Kind != yaml.MappingNode {
					*errs = append(*errs, Errorf(k, "a merge (<<) needs a mapping or a list of mappings"))
					continue
				}
				merged = append(merged, pairs(m, errs)...)
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

// Suggest returns the name in names closest to name (compared in lower
// case) when it is at most two edits away, and "" otherwise.
func Suggest(name string, names []string) string {
	best, bestD := "", 3
	lower := strings.ToLower(name)
	for _, c := range names {
		if d := editDistance(lower, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
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
