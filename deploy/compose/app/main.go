// Command app is the Compose demo's application: the small HTTP service
// nginx fronts and weir protects. It answers every request with a line
// naming its path.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"
	"time"
)

func main() {
	addr := ":3000"
	if a := os.Getenv("APP_ADDR"); a != "" {
		addr = a
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "hello from the app: %s %s\n", r.Method, r.URL.Path)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("app: listening on %s", addr)
	log.Fatal(srv.ListenAndServe())
}
