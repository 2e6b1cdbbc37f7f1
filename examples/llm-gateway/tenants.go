package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

const (
	// maxTenants bounds the keys of a tenants file.
	maxTenants = 100_000
	// maxTenantsFile bounds a tenants file's bytes.
	maxTenantsFile = 32 << 20
	// maxName bounds a user's, team's or organisation's name.
	maxName = 128
)

// tenant is an API key's parents; an empty name is a level the key lacks.
type tenant struct {
	User string `json:"user"`
	Team string `json:"team"`
	Org  string `json:"org"`
}

// tenants maps a key's SHA-256 (keyID) to its parents.
type tenants map[string]tenant

// loadTenants reads a tenants file:
//
//	{"keys": [
//	  {"sha256": "9f86d0…", "user": "alice", "team": "search", "org": "acme"},
//	  {"sha256": "60303a…", "team": "batch", "org": "acme"}
//	]}
//
// sha256 is the hex SHA-256 of the API key (printf %s "$KEY" | sha256sum),
// so that the file holds no key. A key lists each of user, team and org
// at most once, any of them left out; a name is 1 to 128 printable ASCII
// bytes. At most 100,000 keys, 32 MiB. Errors name the entry by its index,
// never its hash.
func loadTenants(path string) (tenants, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTenantsFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxTenantsFile {
		return nil, fmt.Errorf("%s: over %d bytes", path, maxTenantsFile)
	}
	ts, err := parseTenants(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ts, nil
}

// parseTenants parses a tenants file's contents (see loadTenants).
func parseTenants(b []byte) (tenants, error) {
	var doc struct {
		Keys []struct {
			SHA256 string `json:"sha256"`
			tenant
		} `json:"keys"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("not a tenants file ({\"keys\": [{\"sha256\", \"user\", \"team\", \"org\"}, …]}): %v", err)
	}
	if len(doc.Keys) > maxTenants {
		return nil, fmt.Errorf("%d keys, more than %d", len(doc.Keys), maxTenants)
	}
	ts := make(tenants, len(doc.Keys))
	for i, k := range doc.Keys {
		if !isHexHash(k.SHA256) {
			return nil, fmt.Errorf("keys[%d].sha256 is not 64 lower-case hex digits (the SHA-256 of the API key)", i)
		}
		if _, dup := ts[k.SHA256]; dup {
			return nil, fmt.Errorf("keys[%d].sha256 is listed twice", i)
		}
		for _, f := range [...]struct{ name, v string }{{"user", k.User}, {"team", k.Team}, {"org", k.Org}} {
			if f.v != "" && !isName(f.v) {
				return nil, fmt.Errorf("keys[%d].%s %q is not 1 to %d printable ASCII bytes", i, f.name, trim(f.v), maxName)
			}
		}
		ts[k.SHA256] = k.tenant
	}
	return ts, nil
}

// isHexHash reports whether s is a SHA-256 in lower-case hex.
func isHexHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// isName reports whether s is 1 to maxName printable ASCII bytes.
func isName(s string) bool {
	if len(s) == 0 || len(s) > maxName {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// trim shortens s for an error message.
func trim(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}
