package httplimit

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// TestIPv6RotationGrouped: 20 requests from 20 addresses of one /64
// against 1/15m are one client by default; KeyByIPPrefix changes the
// grouping.
func TestIPv6RotationGrouped(t *testing.T) {
	one := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: 15 * time.Minute}
	for _, c := range []struct {
		name string
		opts []Option
		want int
	}{
		{"default", nil, 1},
		{"KeyByIP", []Option{KeyByIP()}, 1},
		{"KeyByIPPrefix(32, 64)", []Option{KeyByIPPrefix(32, 64)}, 1},
		{"KeyByIPPrefix(32, 128)", []Option{KeyByIPPrefix(32, 128)}, 20},
	} {
		var keys []string
		h := New(weir.NewLimiter(memstore.New()), one, append(c.opts, WithObserver(func(d Observation) { keys = append(keys, d.Key) }))...)(hello)
		allowed := 0
		for i := range 20 {
			if w := do(h, fmt.Sprintf("[2001:db8:aa:bb:%x::1]:443", i+1)); w.Code == 200 {
				allowed++
			}
		}
		if allowed != c.want {
			t.Errorf("%s: %d of 20 requests from one /64 admitted, want %d", c.name, allowed, c.want)
		}
		if c.want == 1 && keys[0] != "2001:db8:aa:bb::/64" {
			t.Errorf("%s: key %q, want 2001:db8:aa:bb::/64", c.name, keys[0])
		}
	}
	// IPv4 by /24, and its key.
	var key string
	h := New(weir.NewLimiter(memstore.New()), one, KeyByIPPrefix(24, 48), WithObserver(func(d Observation) { key = d.Key }))(hello)
	do(h, "198.51.100.7:1")
	if w := do(h, "198.51.100.8:1"); w.Code != 429 || key != "198.51.100.0/24" {
		t.Errorf("/24: %d, key %q", w.Code, key)
	}
	if w := do(h, "198.51.101.8:1"); w.Code != 200 {
		t.Errorf("another /24: %d", w.Code)
	}
	for _, bad := range [][2]int{{0, 64}, {33, 64}, {32, 0}, {32, 129}} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), fmt.Sprint(bad[0])) {
					t.Errorf("KeyByIPPrefix(%d, %d): panic %v", bad[0], bad[1], r)
				}
			}()
			New(weir.NewLimiter(memstore.New()), one, KeyByIPPrefix(bad[0], bad[1]))
		}()
	}
}

// TestClientIPHeaderOption: behind a proxy that sets X-Real-IP and passes
// the client's X-Forwarded-For on, a fresh X-Forwarded-For per request is
// no new client; WithClientIPHeader picks the header.
func TestClientIPHeaderOption(t *testing.T) {
	trusted := netip.MustParsePrefix("10.0.0.0/8")
	for _, c := range []struct {
		name string
		opts []Option
		want int
	}{
		{"auto", []Option{KeyByIP(trusted)}, 3},
		{"X-Real-IP", []Option{KeyByIP(trusted), WithClientIPHeader("X-Real-IP")}, 3},
		{"X-Forwarded-For, as asked", []Option{WithClientIPHeader("X-Forwarded-For"), KeyByIP(trusted)}, 6},
	} {
		h := New(weir.NewLimiter(memstore.New()), weir.Limit{Algorithm: weir.FixedWindow, Rate: 3, Period: time.Minute}, c.opts...)(hello)
		allowed := 0
		for i := range 6 {
			if w := do(h, "10.0.0.1:1", "X-Real-IP", "203.0.113.50", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1)); w.Code == 200 {
				allowed++
			}
		}
		if allowed != c.want {
			t.Errorf("%s: %d of 6 admitted, want %d", c.name, allowed, c.want)
		}
	}
	h := New(weir.NewLimiter(memstore.New()), weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute}, KeyByIP(trusted), WithClientIPHeader("CF-Connecting-IP"))(hello)
	do(h, "10.0.0.1:1", "CF-Connecting-IP", "203.0.113.9", "X-Real-IP", "1.1.1.1")
	if w := do(h, "10.0.0.2:1", "Cf-Connecting-Ip", "203.0.113.9", "X-Real-IP", "2.2.2.2"); w.Code != 429 {
		t.Errorf("CF-Connecting-IP: %d, want 429", w.Code)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), `"X Real"`) {
			t.Errorf("bad header: panic %v", r)
		}
	}()
	New(weir.NewLimiter(memstore.New()), weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute}, WithClientIPHeader("X Real"))
}
