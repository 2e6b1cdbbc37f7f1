package weir

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// MaxIdentityLen is the longest identity value kept verbatim in a key;
// longer values are replaced by a hash.
const MaxIdentityLen = 64

// Key builds the state key for a rule and the parts of an identity, as
// "rule:part1:part2". Each part is escaped so that no value can contain the
// separator, a Redis Cluster hash-tag brace, a control byte or invalid UTF-8,
// and a part longer than MaxIdentityLen bytes is replaced by "~" and its
// SHA-256. Two different (rule, parts) never give the same key.
func Key(rule string, parts ...string) string {
	var b strings.Builder
	n := len(rule)
	for _, p := range parts {
		n += 1 + min(len(p), MaxIdentityLen)
	}
	b.Grow(n + n/4) // room for a few escapes: one allocation in the common case
	writeEscaped(&b, rule)
	for _, p := range parts {
		b.WriteByte(':')
		writeEscaped(&b, p)
	}
	return b.String()
}

const hexDigits = "0123456789ABCDEF"

// needsEscape reports the bytes that never appear raw in a key part: the
// separator, the escape and hash markers, braces, spaces, control bytes and
// anything outside ASCII.
func needsEscape(c byte) bool {
	return c <= ' ' || c >= 0x7f || c == ':' || c == '%' || c == '~' || c == '{' || c == '}' || c == '\\'
}

func writeEscaped(b *strings.Builder, s string) {
	if len(s) > MaxIdentityLen {
		sum := sha256.Sum256([]byte(s))
		b.WriteByte('~')
		b.WriteString(base64.RawURLEncoding.EncodeToString(sum[:]))
		return
	}
	if s == "" {
		// An empty part is written as "%" alone, which no escaped value
		// can be, so "a::b" and "a:%:b" never meet.
		b.WriteByte('%')
		return
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c) {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
			continue
		}
		b.WriteByte(c)
	}
}
