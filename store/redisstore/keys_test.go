package redisstore

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/weir-dev/weir"
)

// unescape inverts writeTag for unhashed tags; it exists to prove that the
// escape is injective (a left inverse exists).
func unescape(t *testing.T, tag string) string {
	t.Helper()
	if tag == `\e` {
		return ""
	}
	var b strings.Builder
	for i := 0; i < len(tag); i++ {
		c := tag[i]
		if c != '\\' {
			if c == '{' || c == '}' {
				t.Fatalf("tag %q holds a brace", tag)
			}
			b.WriteByte(c)
			continue
		}
		i++
		if i == len(tag) {
			t.Fatalf("tag %q ends in a lone backslash", tag)
		}
		switch tag[i] {
		case '\\':
			b.WriteByte('\\')
		case '[':
			b.WriteByte('{')
		case ']':
			b.WriteByte('}')
		case '~':
			if i != 1 {
				t.Fatalf("tag %q: \\~ away from the start", tag)
			}
			b.WriteByte('~')
		default:
			t.Fatalf("tag %q: unknown escape \\%c", tag, tag[i])
		}
	}
	return b.String()
}

// craftedKeys are identities built to collide or to break out of a hash tag.
func craftedKeys() []string {
	long := strings.Repeat("x", 10_000)
	keys := []string{
		"", "a", "~", "~a", `\~a`, `\`, `\\`, `\e`, `\[`, "{", "}", "{}", "}{", "{a}", "a{b}c", "a}{b",
		`\{`, `\}`, "{{{{", "}}}}", "a:b", ":", "::", "a\nb", "\n", "\r\n", "a\x00b", "\x00",
		"\xff\xfe\xfd", "\xc3\x28", "ключ", "a b", "weir:{x}:gcra", "x}:gcra", "x}:block",
		long, long + "y", "y" + long, strings.Repeat("{", 150), strings.Repeat("}", 150),
		strings.Repeat("{", 101), strings.Repeat("{", 100), // 202 and 200 escaped bytes
		strings.Repeat("a", 200), strings.Repeat("a", 201),
		weir.Key("login", "1.2.3.4"), weir.Key("login", "1.2.3.4:80"), weir.Key("login", "1.2.3.4", "80"),
		weir.Key("r", strings.Repeat("z", 100)), weir.Key(strings.Repeat("r", 100)),
	}
	// Every escape and the ~ hash form side by side.
	for _, k := range keys[:len(keys):len(keys)] {
		tag := tagOf(k)
		keys = append(keys, tag, "~"+tag, tag+"}")
	}
	return keys
}

func tagOf(key string) string {
	var b strings.Builder
	writeTag(&b, key)
	return b.String()
}

func TestKeyEscaping(t *testing.T) {
	s := &Store{prefix: "weir"}
	keys := craftedKeys()
	rng := rand.New(rand.NewPCG(7, 7))
	for range 2000 {
		b := make([]byte, rng.IntN(260))
		for i := range b {
			alphabet := "\\{}~ab:\x00\xff"
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		keys = append(keys, string(b))
	}
	seen := map[string]string{}
	for _, k := range keys {
		n := s.names(k, "gcra")
		if strings.ContainsAny(n.tag, "{}") {
			t.Fatalf("key %q: tag %q holds a brace", trunc(k), n.tag)
		}
		if n.state != "weir:{"+n.tag+"}:gcra" || n.block != "weir:{"+n.tag+"}:block" {
			t.Fatalf("key %q: names %q, %q do not follow the layout", trunc(k), n.state, n.block)
		}
		if n.tag != tagOf(k) || len(n.tag) != tagLen(k) {
			t.Fatalf("key %q: tag %q, writeTag %q, tagLen %d", trunc(k), n.tag, tagOf(k), tagLen(k))
		}
		if strings.HasPrefix(n.tag, "~") {
			if escapedLen(k) <= maxEscapedKey || len(n.tag) != hashedLen {
				t.Fatalf("key %q (escaped %d bytes) hashed to %q", trunc(k), escapedLen(k), n.tag)
			}
		} else {
			if len(n.tag) > maxEscapedKey {
				t.Fatalf("key %q: tag of %d bytes not hashed", trunc(k), len(n.tag))
			}
			if back := unescape(t, n.tag); back != k {
				t.Fatalf("key %q: tag %q unescapes to %q", trunc(k), n.tag, trunc(back))
			}
		}
		if other, dup := seen[n.state]; dup && other != k {
			t.Fatalf("keys %q and %q share %q", trunc(other), trunc(k), n.state)
		}
		seen[n.state] = k
	}
	if got := tagOf(weir.Key("login", "1.2.3.4")); got != "login:1.2.3.4" {
		t.Fatalf("weir.Key output should stay readable, got %q", got)
	}
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func TestKeyNamesAllocations(t *testing.T) {
	s := &Store{prefix: "weir"}
	for _, tc := range []struct {
		key  string
		want float64
	}{{"login:1.2.3.4", 1}, {"a{b}", 1}, {strings.Repeat("x", 500), 2}} { // hashing copies the key
		if n := testing.AllocsPerRun(100, func() { s.names(tc.key, "token_bucket") }); n != tc.want {
			t.Errorf("names(%q) allocates %v times, want %v", trunc(tc.key), n, tc.want)
		}
	}
}
