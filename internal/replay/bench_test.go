package replay

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
)

// benchLog is an nginx combined log of n lines over a day, from 50k
// clients.
func benchLog(n int) []byte {
	var b bytes.Buffer
	for i := 0; i < n; i++ {
		sec := i * 86400 / n
		ts := fmt.Sprintf("23/Nov/2026:%02d:%02d:%02d +0000", sec/3600, sec/60%60, sec%60)
		c := (i * 7919) % 50000
		method, path := "GET", "/products/42"
		switch i % 100 {
		case 0, 1, 2:
			method, path = "POST", "/login"
		case 3, 4, 5, 6, 7, 8, 9, 10, 11, 12:
			path = "/search?q=boots"
		}
		fmt.Fprintf(&b, "10.%d.%d.%d - - [%s] \"%s %s HTTP/1.1\" 200 5120 \"-\" \"Mozilla/5.0 (X11; Linux x86_64) Firefox/132.0\"\n", c>>16&255, c>>8&255, c&255, ts, method, path)
	}
	return b.Bytes()
}

const benchConfig = `
store: { max_keys: 100000 }
rules:
  - name: login
    match: { methods: [POST], path: /login }
    limit: 5/15m
    algorithm: sliding_log
    block: 15m
  - name: site
    limit: 300/m
  - name: search
    match: { methods: [GET], path: /search }
    limit: 20/m
    algorithm: sliding_window
`

// BenchmarkReplayNginx measures lines/s through three rules, on one
// deciding goroutine and on two; make bench-replay measures the command
// on a 10M-line file.
func BenchmarkReplayNginx(b *testing.B) {
	log := benchLog(200_000)
	cfg, err := policy.Parse([]byte(benchConfig), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	for _, parts := range []int{1, 2} {
		b.Run(fmt.Sprintf("deciders=%d", parts), func(b *testing.B) {
			b.SetBytes(int64(len(log)))
			for i := 0; i < b.N; i++ {
				reps, err := Run(context.Background(), []Input{{Name: "log", R: bytes.NewReader(log)}}, []*config.Config{cfg}, Options{parts: parts})
				if err != nil || reps[0].Lines != 200_000 {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(200_000*b.N)/b.Elapsed().Seconds(), "lines/s")
		})
	}
}
