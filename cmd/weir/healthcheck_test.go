package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealthcheck(t *testing.T) {
	ready := true
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ready {
			http.Error(w, "draining", http.StatusServiceUnavailable)
		}
	}))
	defer ts.Close()
	if out, errs, code := runCLI(t, "healthcheck", "--url", ts.URL+"/readyz"); code != 0 || !strings.Contains(out, "200") {
		t.Fatalf("ready: exit %d, %q %q", code, out, errs)
	}
	ready = false
	if _, errs, code := runCLI(t, "healthcheck", "--url", ts.URL+"/readyz"); code != 1 || !strings.Contains(errs, "503") {
		t.Fatalf("unready: exit %d, %q", code, errs)
	}
	url := ts.URL
	ts.Close()
	if _, errs, code := runCLI(t, "healthcheck", "--url", url, "--timeout", "500ms"); code != 1 || errs == "" {
		t.Fatalf("down: exit %d, %q", code, errs)
	}
	if _, _, code := runCLI(t, "healthcheck", "extra"); code != 2 {
		t.Fatalf("extra argument: exit %d", code)
	}
}
