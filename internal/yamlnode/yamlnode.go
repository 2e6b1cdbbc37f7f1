// Package yamlnode reads weir's YAML files (weir.yaml and the Envoy rate
// limit descriptors) from go.yaml.in/yaml/v3 node trees, so that every
// problem carries the line and column of the value at fault.
//
// Decode parses a file into its one document and refuses alias cycles,
// alias bombs and contradicted tags before anything walks the tree. Mapping checks a mapping's
// keys: each must be known (an unknown key gets a suggestion or a hint),
// given once, and merge keys (<<) are expanded. The readers (String, Bool,
// Int, Duration, Strings...) check one value each and name the field and
// the bad value.
//
// Every problem is an *Error. A caller that reports the first problem
// returns it (the Envoy loader); one that reports them all keeps going and
// collects them (weir.yaml; All flattens what Mapping and Strings return).
//
// Why not yaml.Unmarshal into structs with KnownFields: its errors carry
// no column and no suggestion, a null cannot be told from a missing key,
// and once decoded a value no longer knows its position, which weir.yaml's
// checks need to place the problems they find after the walk.
package yamlnode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// MaxAliasNodes bounds the nodes that aliases may add to a document when
// they are expanded: past it, a small file would expand to a huge tree (an
// alias bomb, "billion laughs").
const MaxAliasNodes = 1_000_000

// maxAliasNodes is MaxAliasNodes, lowered by tests.
var maxAliasNodes = MaxAliasNodes

// Kinds of Decode error, for errors.Is.
var (
	// ErrEmpty is a file with no document: nothing but blanks and comments.
	ErrEmpty = errors.New("yamlnode: no YAML document")
	// ErrSyntax marks an *Error that the YAML parser reported.
	ErrSyntax = errors.New("yamlnode: YAML syntax error")
	// ErrExtraDocument marks an *Error at the start of a second document.
	ErrExtraDocument = errors.New("yamlnode: more than one YAML document")
)

// Error is one problem in a YAML document.
type Error struct {
	// Line and Column locate the offending node, counting from 1; 0 when
	// unknown.
	Line, Column int
	// Path is the offending key or entry below the node that was read,
	// such as "limt" or "[2]"; "" for that node itself.
	Path string
	// Msg says what is wrong, naming the field and the bad value.
	Msg string
	// Kind is ErrSyntax or ErrExtraDocument for those problems of Decode;
	// nil otherwise.
	Kind error
}

// Error renders the problem as "line:col: message".
func (e *Error) Error() string {
	switch {
	case e.Line > 0 && e.Column > 0:
		return fmt.Sprintf("%d:%d: %s", e.Line, e.Column, e.Msg)
	case e.Line > 0:
		return fmt.Sprintf("%d: %s", e.Line, e.Msg)
	}
	return e.Msg
}

// Unwrap returns Kind.
func (e *Error) Unwrap() error { return e.Kind }

// Errorf returns an *Error at node n (nil: no position).
func Errorf(n *yaml.Node, format string, args ...any) *Error {
	e := &Error{Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	return e
}

// Errors is several problems, in the order they were found.
type Errors []*Error

// Error renders one problem per line.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the problems, so that errors.As finds the first.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// err is es as an error: nil when empty.
func (es Errors) err() error {
	if len(es) == 0 {
		return nil
	}
	return es
}

// All returns the problems in err: one for an *Error, each of an Errors,
// none for nil. Any other error becomes one problem without a position.
func All(err error) []*Error {
	var es Errors
	var e *Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &es):
		return es
	case errors.As(err, &e):
		return []*Error{e}
	}
	return []*Error{{Msg: err.Error()}}
}

// Decode parses data, which must hold one YAML document, and returns the
// document's root node, aliases followed. A file with no document is
// ErrEmpty. A syntax error is an *Error of Kind ErrSyntax with the line the
// parser gives (0 when it gives none). An alias inside the node it refers
// to (a cycle), or aliases that would add more than MaxAliasNodes nodes to
// the document, are an *Error at the alias; a value that contradicts its
// explicit tag, such as "!!bool yes", is an *Error at the value.
//
// When the first document is sound but more follows it, Decode returns the
// root along with the error: an *Error of Kind ErrExtraDocument at the
// second document, or a syntax error in it. Callers may refuse the file or
// go on to report what else is wrong with the first document.
func Decode(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, ErrEmpty
		}
		return nil, syntaxError(err)
	}
	root := &doc
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		root = doc.Content[0]
	}
	if err := check(root); err != nil {
		return nil, err
	}
	root = Resolve(root)
	var next yaml.Node
	if err := dec.Decode(&next); err == nil {
		return root, &Error{Line: next.Line, Column: next.Column, Msg: "a second YAML document", Kind: ErrExtraDocument}
	} else if !errors.Is(err, io.EOF) {
		return root, syntaxError(err)
	}
	return root, nil
}

// syntaxError turns the parser's "yaml: line N: message" into an *Error.
func syntaxError(err error) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, m, ok := strings.Cut(rest, ": "); ok {
			if line, err := strconv.Atoi(n); err == nil {
				return &Error{Line: line, Msg: m, Kind: ErrSyntax}
			}
		}
	}
	return &Error{Msg: msg, Kind: ErrSyntax}
}

// survey measures what aliases add to a document once expanded.
type survey struct {
	added int                // nodes added by the aliases seen so far
	size  map[*yaml.Node]int // an anchored node → its expanded size
	open  map[*yaml.Node]bool
}

// check refuses alias cycles, alias bombs and contradicted tags. It visits
// each node of the document once: an anchor's expanded size is kept for
// its aliases, which YAML places after it.
func check(root *yaml.Node) *Error {
	a := &survey{size: map[*yaml.Node]int{}, open: map[*yaml.Node]bool{}}
	_, err := a.measure(root)
	return err
}

// measure returns the expanded size of n.
func (a *survey) measure(n *yaml.Node) (int, *Error) {
	if n.Kind == yaml.AliasNode {
		t := n.Alias
		if t == nil {
			return 1, nil
		}
		if a.open[t] {
			return 0, Errorf(n, "anchor '%s' value contains itself", n.Value)
		}
		s, ok := a.size[t]
		if !ok {
			// An alias names an anchor that came before it, which has
			// been measured or is open; yaml.v3 refuses any other.
			return 0, Errorf(n, "alias *%s names no anchor before it", n.Value)
		}
		if a.added += s; a.added > maxAliasNodes {
			return 0, Errorf(n, "the document expands to too many nodes through aliases (more than %d)", maxAliasNodes)
		}
		return s, nil
	}
	if n.Kind == yaml.ScalarNode && n.Style&yaml.TaggedStyle != 0 && strings.HasPrefix(n.Tag, "!!") {
		// An explicit tag that its value contradicts, such as "!!bool
		// yes" or "!!int ten", is refused rather than read as text.
		var v any
		if err := n.Decode(&v); err != nil {
			return 0, Errorf(n, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		}
	}
	if n.Anchor != "" {
		a.open[n] = true
	}
	size := 1
	for _, c := range n.Content {
		s, err := a.measure(c)
		if err != nil {
			return 0, err
		}
		size += s
	}
	if n.Anchor != "" {
		delete(a.open, n)
		a.size[n] = size
	}
	return size, nil
}

// Resolve follows aliases to the node they name.
func Resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// IsNull reports whether n is absent or YAML null ("key:" with nothing,
// "~", "null").
func IsNull(n *yaml.Node) bool {
	n = Resolve(n)
	return n == nil || n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// Describe names what n is, for "got ..." messages: "a mapping", "a
// list", "nothing", or a scalar's value quoted.
func Describe(n *yaml.Node) string {
	n = Resolve(n)
	switch {
	case n == nil:
		return "nothing"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return strconv.Quote(n.Value)
	}
	return "an unsupported node"
}
