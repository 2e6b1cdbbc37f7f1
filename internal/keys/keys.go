// Package keys builds the state keys of limits (weir.Key), the short
// form of a long identity that lists show, and lease IDs.
package keys

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// MaxIdentityLen is the longest identity value kept verbatim in a key;
// longer values are replaced by a hash.
const MaxIdentityLen = 64

// Key is weir.Key: it builds the state key for a rule and the parts of an identity, as
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

// ShortIdentity returns an identity as Key keeps it when it is long: an
// identity of at most MaxIdentityLen bytes is returned as it is, a longer
// one as "~" and the base64url SHA-256 of it (44 bytes), the part Key
// writes for it. Lists of identities (weir serve's penalty-box index and
// hot keys) keep and show long identities in this form, and the admin API
// accepts it in place of the identity.
func ShortIdentity(identity string) string {
	if len(identity) <= MaxIdentityLen {
		return identity
	}
	sum := sha256.Sum256([]byte(identity))
	return "~" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// hashedLen is the length of a hashed identity: "~" and 43 base64url bytes.
const hashedLen = 1 + 43

// IsHashedIdentity reports whether s has the form ShortIdentity gives a
// long identity. Key escapes the "~" of any identity it keeps verbatim, so
// a key part of this form always stands for a hashed identity, and the
// state of the long identity is KeyOfShort(rule, s).
func IsHashedIdentity(s string) bool {
	if len(s) != hashedLen || s[0] != '~' {
		return false
	}
	b, err := base64.RawURLEncoding.DecodeString(s[1:])
	return err == nil && len(b) == sha256.Size
}

// KeyOfShort returns the state key of rule for an identity in the form
// ShortIdentity returns: Key(rule, identity) for a verbatim identity, and,
// for a hashed one, the key Key gave the long identity it stands for.
func KeyOfShort(rule, short string) string {
	if IsHashedIdentity(short) {
		return Key(rule) + ":" + short
	}
	return Key(rule, short)
}

// NewLeaseID returns a random lease identifier.
func NewLeaseID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
