// Command basic is a hello-world server that lets each client IP make 10
// requests per second.
//
//	go run ./examples/basic
//	curl -i http://127.0.0.1:8090/
//
// It listens on $ADDR (default 127.0.0.1:8090). Past 10 requests in a
// second a client gets 429 with a Retry-After header and a JSON body.
package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/store/memstore"
)

// perIP is the limit every client IP gets.
var perIP = weir.Limit{Algorithm: weir.GCRA, Rate: 10, Period: time.Second}

// newHandler returns the server's handler, limited with lim.
func newHandler(lim *weir.Limiter) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello, world")
	})
	// Clients by IP: an IPv4 client by its address, an IPv6 client by its
	// /64, the block one host owns (KeyByIP's default, spelled out;
	// KeyByIPPrefix(32, 128) would let one host rotate through its /64).
	return httplimit.New(lim, perIP, httplimit.WithName("per-ip"), httplimit.KeyByIPPrefix(32, 64))(mux)
}

func main() {
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8090"
	}
	lim := weir.NewLimiter(memstore.New())
	srv := &http.Server{Addr: addr, Handler: newHandler(lim), ReadHeaderTimeout: 10 * time.Second}
	slog.Info("listening", "addr", "http://"+addr)
	if err := srv.ListenAndServe(); err != nil {
		slog.Error("server stopped", "err", err)
		os.Exit(1)
	}
}
