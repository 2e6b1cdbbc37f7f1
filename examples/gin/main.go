// Command gin shows weir's net/http middleware in a gin application: each
// client IP may make 10 requests per second.
//
//	cd examples/gin && go run .
//	curl -i http://127.0.0.1:8090/hello
//
// It listens on $ADDR (default 127.0.0.1:8090). This directory is its own
// module, so that weir itself does not depend on gin.
package main

import (
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/store/memstore"
)

// Middleware adapts net/http middleware, such as httplimit.New's, to gin.
// The rest of gin's chain runs inside the wrapped http.Handler, so a
// request the middleware answers (a 429, say) goes no further, and
// anything the middleware does after its handler (releasing a concurrency
// lease) happens after the chain.
func Middleware(mw func(http.Handler) http.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		passed := false
		mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			passed = true
			c.Request = r
			c.Next()
		})).ServeHTTP(c.Writer, c.Request)
		if !passed {
			c.Abort()
		}
	}
}

// perIP is the limit every client IP gets.
var perIP = weir.Limit{Algorithm: weir.GCRA, Rate: 10, Period: time.Second}

// newRouter returns the application, limited with lim.
func newRouter(lim *weir.Limiter) *gin.Engine {
	r := gin.New()
	// Clients by IP: an IPv4 client by its address, an IPv6 client by its
	// /64, the block one host owns (KeyByIP's default, spelled out;
	// KeyByIPPrefix(32, 128) would let one host rotate through its /64).
	r.Use(gin.Recovery(), Middleware(httplimit.New(lim, perIP, httplimit.WithName("per-ip"), httplimit.KeyByIPPrefix(32, 64))))
	r.GET("/hello", func(c *gin.Context) {
		c.JSON(http.StatusOK, gin.H{"message": "hello, world"})
	})
	return r
}

func main() {
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8090"
	}
	srv := &http.Server{Addr: addr, Handler: newRouter(weir.NewLimiter(memstore.New())), ReadHeaderTimeout: 10 * time.Second}
	slog.Info("listening", "addr", "http://"+addr)
	if err := srv.ListenAndServe(); err != nil {
		slog.Error("server stopped", "err", err)
		os.Exit(1)
	}
}
