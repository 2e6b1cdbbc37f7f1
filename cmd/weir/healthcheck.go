package main

import (
	"fmt"
	"io"
	"net/http"
	"time"
)

func init() {
	register("healthcheck", "probe a weir serve endpoint over HTTP: exit 0 on 200, else 1 (for a container's HEALTHCHECK)", runHealthcheck)
}

// runHealthcheck GETs --url and succeeds on a 200. An image without a
// shell or curl runs it as its HEALTHCHECK.
func runHealthcheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("weir healthcheck", `Usage: weir healthcheck [--url URL] [--timeout D]

GETs URL (default weir serve's readiness on this host) and exits 0 when it
answers 200 OK, else 1 with the reason on stderr.

Flags:`, stderr)
	url := fs.String("url", "http://127.0.0.1:8080/readyz", "the URL to GET")
	timeout := fs.Duration("timeout", 2*time.Second, "how long the probe may take")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "weir healthcheck: unexpected argument %q (flags start with --)\n", fs.Arg(0))
		return 2
	}
	c := &http.Client{Timeout: *timeout}
	resp, err := c.Get(*url)
	if err != nil {
		fmt.Fprintln(stderr, "weir healthcheck:", err)
		return 1
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "weir healthcheck: %s: %s\n", *url, resp.Status)
		return 1
	}
	fmt.Fprintf(stdout, "weir healthcheck: %s: %s\n", *url, resp.Status)
	return 0
}
