package server

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/weir-dev/weir/internal/buildinfo"
)

// TestBuildInfo: weir_build_info and the dashboard snapshot name the same
// version, the build's own by default.
func TestBuildInfo(t *testing.T) {
	_, ts := newTestServer(t)
	_, b := call(t, "GET", ts.URL+"/metrics", "")
	m := regexp.MustCompile(`(?m)^weir_build_info\{goversion="([^"]+)",revision="([^"]+)",version="([^"]+)"\} 1$`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("no weir_build_info series in:\n%s", firstLines(string(b), "weir_build"))
	}
	want := buildinfo.Read()
	if m[1] != want.GoVersion || m[3] != want.Short() {
		t.Errorf("weir_build_info goversion=%q version=%q, want %q %q", m[1], m[3], want.GoVersion, want.Short())
	}
	_, b = call(t, "GET", ts.URL+"/v1/dashboard/snapshot", "")
	var snap struct {
		Instance struct{ Version string } `json:"instance"`
	}
	if err := json.Unmarshal(b, &snap); err != nil {
		t.Fatal(err)
	}
	if snap.Instance.Version != m[3] {
		t.Errorf("snapshot version %q, metric %q", snap.Instance.Version, m[3])
	}

	_, ts = newTestServer(t, WithVersion("v9.8.7"))
	_, b = call(t, "GET", ts.URL+"/metrics", "")
	if !strings.Contains(string(b), `version="v9.8.7"`) {
		t.Errorf("WithVersion not in weir_build_info:\n%s", firstLines(string(b), "weir_build"))
	}
}

func firstLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) || strings.HasPrefix(l, "# HELP "+prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
