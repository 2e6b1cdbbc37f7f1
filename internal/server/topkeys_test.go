package server

import (
	"encoding/json"
	"testing"
)

// topKeysByMap is how /v1/check told an Envoy-style body apart before
// topKeys: decode the body into a map and look the keys up.
func topKeysByMap(body []byte) (envoy, rule bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return false, false
	}
	_, hasDomain := fields["domain"]
	_, hasDesc := fields["descriptors"]
	_, hasRule := fields["rule"]
	return hasDomain || hasDesc, hasRule
}

var topKeysSeeds = []string{
	`{"rule":"demo-ip","key":"10.0.0.1"}`,
	`{"domain":"rl","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`,
	`{"descriptors":[]}`,
	` { "rule" : "x" , "domain" : {"rule":1} } `,
	`{"a":{"domain":1},"b":["domain",{"descriptors":2}]}`,
	`{"\u0064omain":"rl"}`,
	`{"Domain":"rl","RULE":"x"}`,
	`{"domain\u0000":"rl"}`,
	`{"x":"a\"domain\":1"}`,
	`{"x":"\\","domain":1}`,
	`{"n":-1.5e3,"t":true,"f":false,"z":null,"descriptors":0}`,
	`{}`, `null`, `[{"domain":1}]`, `"domain"`, `{"domain":}`, `{"domain":1`, `{"domain":1}x`, ``,
	`{"rule":1,"rule":2}`,
}

// topKeys finds what decoding into a map found, on every body.
func TestTopKeysAsMap(t *testing.T) {
	for _, s := range topKeysSeeds {
		e, r := topKeys([]byte(s))
		we, wr := topKeysByMap([]byte(s))
		if e != we || r != wr {
			t.Errorf("topKeys(%s) = %v, %v; the map gives %v, %v", s, e, r, we, wr)
		}
	}
}

func FuzzTopKeys(f *testing.F) {
	for _, s := range topKeysSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, r := topKeys(b)
		we, wr := topKeysByMap(b)
		if e != we || r != wr {
			t.Fatalf("topKeys(%q) = %v, %v; the map gives %v, %v", b, e, r, we, wr)
		}
	})
}
