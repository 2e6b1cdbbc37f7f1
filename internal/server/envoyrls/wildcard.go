package envoyrls

import "strings"

// wildcardMatch reports whether s matches the wildcard pattern split at
// each '*' into parts: every '*' stands for any run of bytes, empty
// included, and nothing else is special. This is envoyproxy/ratelimit's
// matching, applied as it applies it to "key_value" (or to the key alone
// for a descriptor without a value) against the request entry's
// key + "_" + value.
func wildcardMatch(parts []string, s string) bool {
	if len(parts) == 1 {
		return parts[0] == s
	}
	first, last := parts[0], parts[len(parts)-1]
	fixed := 0
	for _, p := range parts {
		fixed += len(p)
	}
	if len(s) < fixed || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	// The middle parts, in order, each at its leftmost place between the
	// first and the last: the leftmost place leaves the most room to the
	// parts after it, so it finds a match whenever there is one.
	rest := s[len(first) : len(s)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// fullKey is the node's key_value, or its key alone without a value.
func (n *node) fullKey() string {
	if n.value == "" {
		return n.key
	}
	return n.key + "_" + n.value
}

// splitStar splits a wildcard pattern at each '*'.
func splitStar(pattern string) []string { return strings.Split(pattern, "*") }
