package weir_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/weir-dev/weir"
)

func TestKeyInjective(t *testing.T) {
	long := strings.Repeat("a", 65)
	cases := [][]string{
		{"r"}, {"r", ""}, {"r", "", ""}, {"r", "a"}, {"r", "a:b"}, {"r", "a", "b"}, {"r:a", "b"},
		{"r", "a%3Ab"}, {"r", "%"}, {"r", "%25"}, {"r", "~"}, {"r", long}, {"r", long + "b"},
		{"r", "{x}"}, {"r", "%7Bx%7D"}, {"r", "a\nb"}, {"r", "a b"}, {"r", "\xff"}, {"r", "ключ"},
		{"r", strings.Repeat("a", 64)}, {"r", "~" + strings.Repeat("A", 43)},
	}
	seen := map[string][]string{}
	for _, c := range cases {
		k := weir.Key(c[0], c[1:]...)
		if prev, dup := seen[k]; dup {
			t.Fatalf("Key(%q) == Key(%q) == %q", c, prev, k)
		}
		seen[k] = c
		if strings.ContainsAny(k, "{}\\\n\x00 ") || !utf8.ValidString(k) {
			t.Errorf("Key(%q) = %q contains a brace, space, control byte or invalid UTF-8", c, k)
		}
		if strings.Count(k, ":") != len(c)-1 {
			t.Errorf("Key(%q) = %q: separators leaked from a value", c, k)
		}
	}
}

func TestKeyReadableAndBounded(t *testing.T) {
	if got := weir.Key("login", "1.2.3.4"); got != "login:1.2.3.4" {
		t.Errorf("got %q", got)
	}
	if got := weir.Key("api", "2001:db8::1"); got != "api:2001%3Adb8%3A%3A1" {
		t.Errorf("got %q", got)
	}
	k := weir.Key("r", strings.Repeat("x", 10_000))
	if len(k) > 2+1+43 {
		t.Errorf("a 10 KB identity gave a %d-byte key", len(k))
	}
}

func TestKeyAllocatesOnce(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = weir.Key("per-ip", "198.51.100.7") }); n > 1 {
		t.Errorf("Key allocates %v times, want 1", n)
	}
}
