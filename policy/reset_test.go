package policy

import (
	"testing"

	"github.com/weir-dev/weir/store/memstore"
)

// TestResetUseIPIdentity: an identity counted through on_missing: use_ip is
// reported as "ip:ADDR"; resetting that identity must clear its state and
// lift its penalty box (the dashboard's Unblock does exactly this).
func TestResetUseIPIdentity(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: otp, match: {path: /otp}, identity: header:X-User, on_missing: use_ip, limit: 2/h, algorithm: fixed_window, block: 1h}
`, memstore.New())
	r := req("POST", "/otp")
	r.RemoteAddr = "192.0.2.44:5555"
	var v Verdict
	for i := 0; i < 3; i++ {
		v = p.Check(ctx, r)
	}
	if v.Allowed || v.Results[0].Result.BlockedUntil.IsZero() {
		t.Fatalf("third attempt: %+v, want blocked", v)
	}
	id := v.Results[0].Identity
	if id != "ip:192.0.2.44" {
		t.Fatalf("identity %q", id)
	}
	if err := p.Reset(ctx, "otp", id); err != nil {
		t.Fatal(err)
	}
	if v := p.Check(ctx, r); !v.Allowed {
		t.Fatalf("after Reset(%q) the client is still limited: %+v", id, v.Results[0].Result)
	}
}
