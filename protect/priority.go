package protect

import (
	"context"
	"strings"
)

// Priority orders requests for shedding: Sheddable ones go first, Critical
// ones last.
type Priority int8

// The priorities, lowest first.
const (
	Sheddable Priority = iota
	Normal
	Critical
)

// NumPriorities is how many priorities there are, for arrays indexed by
// Priority.
const NumPriorities = 3

// String returns "sheddable", "normal" or "critical".
func (p Priority) String() string {
	switch p {
	case Sheddable:
		return "sheddable"
	case Critical:
		return "critical"
	}
	return "normal"
}

// ParsePriority reads a priority as a request header carries it:
// "critical", "normal" or "sheddable", in any case, blanks trimmed.
// Anything else, the empty string included, is Normal: an unknown value
// never makes a request critical.
func ParsePriority(s string) Priority {
	s = strings.TrimSpace(s)
	switch {
	case strings.EqualFold(s, "critical"):
		return Critical
	case strings.EqualFold(s, "sheddable"):
		return Sheddable
	}
	return Normal
}

type priorityKey struct{}

// WithPriority returns a context carrying p, which Transport reads for
// the outbound calls made with it.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// PriorityFrom returns the priority ctx carries, or Normal.
func PriorityFrom(ctx context.Context) Priority {
	if p, ok := ctx.Value(priorityKey{}).(Priority); ok {
		return p
	}
	return Normal
}
