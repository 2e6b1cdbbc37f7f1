package clientip_test

import (
	"fmt"
	"net/http/httptest"
	"net/netip"

	"github.com/weir-dev/weir/clientip"
)

// Behind a proxy you run, the client is the address the proxy forwarded;
// from anyone else, forwarding headers are ignored.
func ExampleFrom() {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}

	viaProxy := httptest.NewRequest("GET", "/", nil)
	viaProxy.RemoteAddr = "10.0.0.5:41000"
	viaProxy.Header.Set("X-Forwarded-For", "198.51.100.7, 10.0.0.9")
	fmt.Println(clientip.From(viaProxy, trusted, clientip.Auto))

	direct := httptest.NewRequest("GET", "/", nil)
	direct.RemoteAddr = "203.0.113.4:5000"
	direct.Header.Set("X-Forwarded-For", "192.0.2.1")
	fmt.Println(clientip.From(direct, trusted, clientip.Auto))

	h, ok := clientip.CanonicalHeader("cf-connecting-ip")
	fmt.Println(h, ok)
	// Output:
	// 198.51.100.7
	// 203.0.113.4
	// Cf-Connecting-Ip true
}
