// Command gen writes a synthetic nginx combined access log for make
// bench-replay: LINES lines over one day, clients drawn from a skewed
// population of addresses, a few heavy hitters, logins and searches.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"
)

func main() {
	lines := flag.Int("lines", 10_000_000, "lines to write")
	clients := flag.Int("clients", 200_000, "distinct client addresses")
	seed := flag.Uint64("seed", 1, "random seed")
	flag.Parse()
	rng := rand.New(rand.NewPCG(*seed, 2))
	zipf := rand.NewZipf(rand.New(rand.NewPCG(*seed, 3)), 1.1, 8, uint64(*clients-1))
	w := bufio.NewWriterSize(os.Stdout, 1<<20)
	defer w.Flush()
	start := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	span := 24 * time.Hour
	paths := []string{"/", "/products", "/products/42", "/cart", "/static/app.js", "/static/site.css", "/api/orders?page=2", "/about"}
	uas := []string{
		"Mozilla/5.0 (X11; Linux x86_64; rv:132.0) Gecko/20100101 Firefox/132.0",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_1) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1 Safari/605.1.15",
		"curl/8.5.0",
	}
	var lastSec int64 = -1
	var ts string
	for i := 0; i < *lines; i++ {
		t := start.Add(time.Duration(int64(span) / int64(*lines) * int64(i)))
		if s := t.Unix(); s != lastSec {
			lastSec, ts = s, t.Format("02/Jan/2006:15:04:05 -0700")
		}
		c := zipf.Uint64()
		ip := "10." + strconv.Itoa(int(c>>16&255)) + "." + strconv.Itoa(int(c>>8&255)) + "." + strconv.Itoa(int(c&255))
		method, path, status := "GET", paths[rng.IntN(len(paths))], 200
		switch r := rng.IntN(100); {
		case r < 3:
			method, path, status = "POST", "/login", 302
		case r < 13:
			path = "/search?q=" + strconv.Itoa(rng.IntN(1000))
		}
		fmt.Fprintf(w, "%s - - [%s] \"%s %s HTTP/1.1\" %d %d \"-\" \"%s\"\n", ip, ts, method, path, status, 200+rng.IntN(20000), uas[rng.IntN(len(uas))])
	}
}
