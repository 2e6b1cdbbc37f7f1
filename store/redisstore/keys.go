package redisstore

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// maxEscapedKey is the longest escaped key kept verbatim in a Redis key;
// longer ones are replaced by "~" and the SHA-256 of the raw key.
const maxEscapedKey = 200

// escapedLen returns the length of key once escaped, before hashing.
func escapedLen(key string) int {
	if key == "" {
		return 2
	}
	n := len(key)
	for i := 0; i < len(key); i++ {
		switch key[i] {
		case '\\', '{', '}':
			n++
		}
	}
	if key[0] == '~' {
		n++
	}
	return n
}

// hashedLen is the length of "~" + base64url(sha256) without padding.
const hashedLen = 1 + 43

// tagLen returns the length of the hash tag that writeTag writes for key.
func tagLen(key string) int {
	if n := escapedLen(key); n <= maxEscapedKey {
		return n
	}
	return hashedLen
}

// writeTag writes key as it appears between the braces of a Redis key: an
// injective escape that never contains a brace, so the whole escaped key is
// the Redis Cluster hash tag and a key's state and penalty box always share
// one slot, whatever bytes the key holds.
//
//	\ → \\   { → \[   } → \]   a leading ~ → \~   the empty key → \e
//
// weir.Key's output contains none of these, so real keys stay readable. An
// escaped key longer than 200 bytes is replaced by "~" and the unpadded
// base64url SHA-256 of the raw key; no escaped key starts with a bare "~",
// so the two forms never meet.
func writeTag(b *strings.Builder, key string) {
	n := escapedLen(key)
	if n > maxEscapedKey {
		sum := sha256.Sum256([]byte(key))
		var enc [43]byte
		base64.RawURLEncoding.Encode(enc[:], sum[:])
		b.WriteByte('~')
		b.Write(enc[:])
		return
	}
	if key == "" {
		b.WriteString(`\e`)
		return
	}
	if n == len(key) {
		b.WriteString(key)
		return
	}
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c == '\\':
			b.WriteString(`\\`)
		case c == '{':
			b.WriteString(`\[`)
		case c == '}':
			b.WriteString(`\]`)
		case c == '~' && i == 0:
			b.WriteString(`\~`)
		default:
			b.WriteByte(c)
		}
	}
}

// keyNames holds a request's two Redis keys and its hash tag, all slices of
// one string.
type keyNames struct {
	state, block, tag string
}

// names builds "<prefix>:{<tag>}:<algorithm>" and "<prefix>:{<tag>}:block"
// in one allocation.
func (s *Store) names(key string, algo string) keyNames {
	tl := tagLen(key)
	stateLen := len(s.prefix) + 2 + tl + 2 + len(algo)
	var b strings.Builder
	b.Grow(stateLen + len(s.prefix) + 2 + tl + len("}:block"))
	b.WriteString(s.prefix)
	b.WriteString(":{")
	writeTag(&b, key)
	// The builder never rewrites what it holds, so this view of the tag
	// stays valid; copying it spares escaping (or hashing) the key twice.
	tag := b.String()[len(s.prefix)+2:]
	b.WriteString("}:")
	b.WriteString(algo)
	b.WriteString(s.prefix)
	b.WriteString(":{")
	b.WriteString(tag)
	b.WriteString("}:block")
	all := b.String()
	return keyNames{
		state: all[:stateLen],
		block: all[stateLen:],
		tag:   all[len(s.prefix)+2 : len(s.prefix)+2+tl],
	}
}

// slot returns the Redis Cluster hash slot of a key whose hash tag is tag:
// CRC16 (XMODEM) of the tag, modulo 16384.
func slot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^tag[i]]
	}
	return crc & 16383
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
