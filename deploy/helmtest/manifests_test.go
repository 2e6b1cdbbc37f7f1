package helmtest

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite deploy/kubernetes from the chart")

// plainManifests is the file the chart's default rendering is kept in.
const plainManifests = "../kubernetes/weir.yaml"

const plainHeader = `# weir for kubectl: the Helm chart deploy/helm/weir rendered with its
# default values (release name weir, no namespace: kubectl apply -n picks
# it). Generated; do not edit. After a change to the chart, regenerate it:
#   cd deploy/helmtest && go test -run TestPlainManifests -update
# deploy/kubernetes/README.md says what to change before applying it.
`

// renderPlain renders the chart's defaults as the plain manifests hold
// them.
func renderPlain(t *testing.T) string {
	t.Helper()
	rendered, err := renderAs("", "kubectl")
	if err != nil {
		t.Fatal(err)
	}
	return plainHeader + "---\n" + strings.Join(manifest(rendered), "---\n")
}

// TestPlainManifests: deploy/kubernetes/weir.yaml is, byte for byte, the
// chart rendered with its default values; -update rewrites it. Every
// object in it decodes strictly.
func TestPlainManifests(t *testing.T) {
	want := renderPlain(t)
	if *update {
		if err := os.MkdirAll(filepath.Dir(plainManifests), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(plainManifests, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := string(readFile(t, plainManifests))
	if got != want {
		t.Fatalf("deploy/kubernetes/weir.yaml is not the chart's rendering: regenerate it with\n  cd deploy/helmtest && go test -run TestPlainManifests -update")
	}
	docs := splitYAML(strings.TrimPrefix(got, plainHeader))
	objs, err := decodeAll(docs)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) < 5 {
		t.Fatalf("%d objects in deploy/kubernetes/weir.yaml, want the default rendering's", len(objs))
	}
	checkCommon(t, objs)
	for _, d := range objs {
		if strings.Contains(d.yaml, "managed-by: Helm") {
			t.Errorf("%s claims to be managed by Helm", d.template)
		}
	}
}
