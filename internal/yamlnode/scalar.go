package yamlnode

import (
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// The readers below check one value, named name in their messages, and
// return its zero value with an *Error at the node when it is wrong.
// String, Bool, BoolYAML11 and Strings read null as the zero value; the
// number and duration readers refuse it, since a number left out of a
// "key:" line is more likely a slip than a zero. A caller for which null
// means "unset" checks IsNull first.

// String reads a scalar as text. Numbers and booleans keep their text, as
// written.
func String(n *yaml.Node, name string) (string, error) {
	n = Resolve(n)
	if IsNull(n) {
		return "", nil
	}
	if n.Kind != yaml.ScalarNode {
		return "", Errorf(n, "%s must be a single value, not %s", name, Describe(n))
	}
	return n.Value, nil
}

// Bool reads true or false.
func Bool(n *yaml.Node, name string) (bool, error) {
	n = Resolve(n)
	if IsNull(n) {
		return false, nil
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!bool" {
		var b bool
		if err := n.Decode(&b); err == nil {
			return b, nil
		}
	}
	return false, Errorf(n, "%s must be true or false, got %s", name, Describe(n))
}

// BoolYAML11 reads true or false, and the YAML 1.1 spellings y, yes, on,
// n, no and off when they are not quoted, for formats whose other readers
// follow YAML 1.1.
func BoolYAML11(n *yaml.Node, name string) (bool, error) {
	n = Resolve(n)
	if n.Kind == yaml.ScalarNode && n.Style == 0 {
		switch n.Value {
		case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON":
			return true, nil
		case "n", "N", "no", "No", "NO", "off", "Off", "OFF":
			return false, nil
		}
	}
	return Bool(n, name)
}

// Int reads a whole number.
func Int(n *yaml.Node, name string) (int64, error) {
	n = Resolve(n)
	var v int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
		return 0, Errorf(n, "%s must be a whole number, got %s", name, Describe(n))
	}
	return v, nil
}

// IntMin reads a whole number no smaller than low.
func IntMin(n *yaml.Node, name string, low int64) (int64, error) {
	v, err := Int(n, name)
	if err != nil {
		return 0, err
	}
	if v < low {
		return 0, Errorf(Resolve(n), "%s must be at least %d, got %d", name, low, v)
	}
	return v, nil
}

// Ratio reads a number above 0 and at most 1.
func Ratio(n *yaml.Node, name string) (float64, error) {
	n = Resolve(n)
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!float" || n.Tag == "!!int") {
		v, err := strconv.ParseFloat(n.Value, 64)
		if err == nil && v > 0 && v <= 1 {
			return v, nil
		}
	}
	return 0, Errorf(n, "%s must be a number above 0 and at most 1, got %s", name, Describe(n))
}

// Duration reads a positive duration: a Go duration ("50ms", "1h30m") in
// whole microseconds, or a number of days from 1d to 36500d.
func Duration(n *yaml.Node, name string) (time.Duration, error) {
	n = Resolve(n)
	if n.Kind != yaml.ScalarNode || IsNull(n) {
		return 0, Errorf(n, "%s must be a duration such as 500ms, 15m or 1h, got %s", name, Describe(n))
	}
	d, msg := parseDuration(n.Value)
	if msg != "" {
		return 0, Errorf(n, "%s %s", name, msg)
	}
	return d, nil
}

func parseDuration(s string) (time.Duration, string) {
	q := strconv.Quote(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.ParseInt(days, 10, 64); err == nil {
			if n <= 0 || n > 36500 {
				return 0, "must be from 1d to 36500d, got " + q
			}
			return time.Duration(n) * 24 * time.Hour, ""
		}
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return 0, q + " has no unit (such as 500ms, 15m, 1h or 7d)"
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, q + " is not a duration (such as 500ms, 15m, 1h or 7d)"
	}
	if d <= 0 {
		return 0, "must be positive, got " + q
	}
	if d%time.Microsecond != 0 {
		return 0, q + " is not a whole number of microseconds"
	}
	return d, ""
}

// Strings reads a list of strings, and a single string as a list of one
// when one is set. It returns each entry's node too, to place later
// problems. An entry that is not a string reads as "" and is reported
// with Path "[i]"; the other entries are still returned.
func Strings(n *yaml.Node, name string, one bool) ([]string, []*yaml.Node, error) {
	n = Resolve(n)
	if IsNull(n) {
		return nil, nil, nil
	}
	if n.Kind == yaml.ScalarNode && one {
		return []string{n.Value}, []*yaml.Node{n}, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, nil, Errorf(n, "%s must be a list of strings, got %s", name, Describe(n))
	}
	out := make([]string, 0, len(n.Content))
	nodes := make([]*yaml.Node, 0, len(n.Content))
	var errs Errors
	for i, e := range n.Content {
		e = Resolve(e)
		nodes = append(nodes, e)
		if e.Kind != yaml.ScalarNode || IsNull(e) {
			pe := Errorf(e, "%s entries must be strings, got %s", name, Describe(e))
			pe.Path = "[" + strconv.Itoa(i) + "]"
			errs = append(errs, pe)
			out = append(out, "")
			continue
		}
		out = append(out, e.Value)
	}
	return out, nodes, errs.err()
}
