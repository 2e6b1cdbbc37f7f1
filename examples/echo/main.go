// Command echo shows weir's net/http middleware in an echo (v5)
// application: each client IP may make 10 requests per second.
//
//	cd examples/echo && go run .
//	curl -i http://127.0.0.1:8090/hello
//
// It listens on $ADDR (default 127.0.0.1:8090). This directory is its own
// module, so that weir itself does not depend on echo.
package main

import (
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/store/memstore"
)

// perIP is the limit every client IP gets.
var perIP = weir.Limit{Algorithm: weir.GCRA, Rate: 10, Period: time.Second}

// newServer returns the application, limited with lim. echo.WrapMiddleware
// is the whole adapter: it runs the rest of echo's chain inside the
// wrapped http.Handler.
func newServer(lim *weir.Limiter) *echo.Echo {
	e := echo.New()
	e.Use(middleware.Recover())
	// Clients by IP: an IPv4 client by its address, an IPv6 client by its
	// /64, the block one host owns (KeyByIP's default, spelled out;
	// KeyByIPPrefix(32, 128) would let one host rotate through its /64).
	e.Use(echo.WrapMiddleware(httplimit.New(lim, perIP, httplimit.WithName("per-ip"), httplimit.KeyByIPPrefix(32, 64))))
	e.GET("/hello", func(c *echo.Context) error {
		return c.JSON(http.StatusOK, map[string]string{"message": "hello, world"})
	})
	return e
}

func main() {
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8090"
	}
	srv := &http.Server{Addr: addr, Handler: newServer(weir.NewLimiter(memstore.New())), ReadHeaderTimeout: 10 * time.Second}
	slog.Info("listening", "addr", "http://"+addr)
	if err := srv.ListenAndServe(); err != nil {
		slog.Error("server stopped", "err", err)
		os.Exit(1)
	}
}
