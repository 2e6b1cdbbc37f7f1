package server

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
)

// Values of Snapshot.Identities and of /v1/top's "identities".
const (
	identitiesFull     = "full"
	identitiesRedacted = "redacted"
)

// redactor hides identities from the read-only endpoints (the dashboard
// snapshot, /v1/top) for callers without the admin token. An identity
// becomes a tag, "#" and the first 8 bytes of its HMAC-SHA256 under a key
// drawn at random when the process starts, in hex: within one instance the
// same identity always shows the same tag, so a page can still tell one
// hot client from many, but a tag cannot be reversed, and without the key
// nobody can find which tag a guessed identity (an IPv4 address, say) has,
// even by hashing every candidate.
type redactor struct{ key []byte }

func newRedactor() *redactor {
	k := make([]byte, 32)
	_, _ = rand.Read(k) // crypto/rand.Read never fails on a supported platform
	return &redactor{key: k}
}

// tag returns the redacted form of identity.
func (rd *redactor) tag(identity string) string {
	m := hmac.New(sha256.New, rd.key)
	m.Write([]byte(identity))
	var sum [sha256.Size]byte
	return "#" + hex.EncodeToString(m.Sum(sum[:0])[:8])
}

// tops returns a copy of tops with every identity redacted.
func (rd *redactor) tops(tops map[string][]TopEntry) map[string][]TopEntry {
	out := make(map[string][]TopEntry, len(tops))
	for rule, es := range tops {
		cp := make([]TopEntry, len(es))
		for i, e := range es {
			e.Identity = rd.tag(e.Identity)
			cp[i] = e
		}
		out[rule] = cp
	}
	return out
}

// blocked returns a copy of es with every identity redacted.
func (rd *redactor) blocked(es []BlockedEntry) []BlockedEntry {
	out := make([]BlockedEntry, len(es))
	for i, e := range es {
		e.Identity = rd.tag(e.Identity)
		out[i] = e
	}
	return out
}

// readAccess decides what a read-only endpoint shows r: every identity
// with the admin token, tags without it (or with the admin API off). A
// request that sends a wrong token is answered 401, and one from a client
// refused for failing too often 429, as on the admin API, so that these
// endpoints are no way around its failure limit; ok is false then.
func (s *Server) readAccess(w http.ResponseWriter, r *http.Request) (full, ok bool) {
	switch s.auth.check(w, r, false, s.adminEnv) {
	case authAdmin:
		return true, true
	case authNone:
		return false, true
	}
	return false, false
}
