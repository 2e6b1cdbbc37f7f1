package envoyrls

import (
	"context"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/store/redisstore"
)

// eachStore runs f as two subtests: over memstore and over a real
// redis-server, both on the harness's clock.
func eachStore(t *testing.T, cfg *Config, opts []Option, f func(t *testing.T, h *harness)) {
	t.Run("memstore", func(t *testing.T) {
		f(t, start(t, cfg, opts...))
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		h := &harness{t: t, clk: newClock()}
		rs, err := redisstore.New(context.Background(), redisstore.Config{Addrs: []string{srv.Addr}, Clock: h.clk.Now, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		h.store = memstore.New() // unused: the service runs over Redis
		f(t, h.serve(cfg, rs, opts))
	})
}
