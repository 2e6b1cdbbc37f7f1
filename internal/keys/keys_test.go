package keys

import (
	"strings"
	"testing"
)

func TestShortIdentity(t *testing.T) {
	long := strings.Repeat("k", 1<<20)
	short := ShortIdentity(long)
	if len(short) != 44 || !IsHashedIdentity(short) {
		t.Fatalf("ShortIdentity of 1 MB: %q", short)
	}
	if got, want := KeyOfShort("api", short), Key("api", long); got != want {
		t.Fatalf("KeyOfShort(api, %s) = %q, want Key's %q", short, got, want)
	}
	for _, id := range []string{"192.0.2.1", "~abc", strings.Repeat("x", MaxIdentityLen), "~" + strings.Repeat("A", 43)[:42] + "!"} {
		if ShortIdentity(id) != id && len(id) <= MaxIdentityLen {
			t.Fatalf("ShortIdentity(%q) changed a short identity", id)
		}
		if IsHashedIdentity(id) {
			t.Fatalf("IsHashedIdentity(%q)", id)
		}
		if KeyOfShort("r", id) != Key("r", id) {
			t.Fatalf("KeyOfShort(r, %q) = %q, want %q", id, KeyOfShort("r", id), Key("r", id))
		}
	}
}
