package policy

import (
	"strings"
	"testing"
)

func TestDenyCacheConfig(t *testing.T) {
	base := "rules:\n  - name: r\n    limit: 10/s\n    identity: ip\nstore:\n"
	c, err := Parse([]byte(base+"  max_keys: 5\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Store.DenyCacheOn() || c.Store.DenyCacheSize != 0 {
		t.Fatalf("default: on %v size %d", c.Store.DenyCacheOn(), c.Store.DenyCacheSize)
	}
	c, err = Parse([]byte(base+"  deny_cache: false\n  deny_cache_size: 5000\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Store.DenyCacheOn() || c.Store.DenyCacheSize != 5000 {
		t.Fatalf("off: on %v size %d", c.Store.DenyCacheOn(), c.Store.DenyCacheSize)
	}
	for in, want := range map[string]string{
		"  deny_cache_size: 0\n":         "t.yaml:7:",
		"  deny_cache_size: 200000000\n": "200000000",
		"  deny_cache: maybe\n":          "maybe",
	} {
		_, err := Parse([]byte(base+"  max_keys: 5\n"+in), "t.yaml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: want an error naming %q, got %v", in, want, err)
		}
	}
}
