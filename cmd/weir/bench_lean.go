//go:build bench

package main

import (
	"context"

	"github.com/weir-dev/weir/internal/h2client"
)

// The lean gRPC client is built into weir bench only with the bench tag:
// it is a hand-written HTTP/2 client, which the product binary does
// without (docs/benchmarks.md, "weir bench's HTTP/2 client").
func init() { leanClient = benchConfig.leanCallers }

// leanCallers returns the lean client's callers for --target grpc, one per
// --connections, and the function that closes them all. A connection used
// by a single caller (the default, --connections = --concurrency) runs
// synchronously; one shared by several callers multiplexes their streams.
//
// ruled is what the first call found: the lean client reads only the
// verdict, so an allowed call counts as decided by a rule when that one was.
func (c benchConfig) leanCallers(ruled bool) ([]caller, func()) {
	clients := make([]*h2client.Client, max(c.conns, 1))
	out := make([]caller, len(clients))
	for i := range clients {
		// bench hands worker w the caller w % len(callers).
		users := c.concurrency / len(clients)
		if i < c.concurrency%len(clients) {
			users++
		}
		cl := h2client.New(c.addr, c.domain, users > 1)
		cl.SetDescriptors(c.descriptors)
		clients[i] = cl
		out[i] = func(ctx context.Context, key string) (decision, error) {
			ok, err := cl.ShouldRateLimit(ctx, key)
			return decision{allowed: ok, ruled: !ok || ruled}, err
		}
	}
	return out, func() {
		for _, cl := range clients {
			cl.Close()
		}
	}
}
