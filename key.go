package weir

import "github.com/weir-dev/weir/internal/keys"

// Key builds the state key for a rule and the parts of an identity, as
// "rule:part1:part2". Each part is escaped so that no value can contain the
// separator, a Redis Cluster hash-tag brace, a control byte or invalid UTF-8,
// and a part longer than 64 bytes is replaced by "~" and its SHA-256. Two
// different (rule, parts) never give the same key.
func Key(rule string, parts ...string) string { return keys.Key(rule, parts...) }
