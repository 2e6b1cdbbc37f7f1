package helmtest

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "../helm/weir"
	repoRoot  = "../.."
	release   = "weir"
	namespace = "weir"
)

// doc is one rendered object: the template it came from, its YAML, and
// the typed object it decoded into.
type doc struct {
	template string
	yaml     string
	obj      any
}

// objects is a chart's rendering, decoded.
type objects []doc

// newObject returns an empty typed object for apiVersion and kind, or nil
// if the chart is not expected to render that kind.
func newObject(apiVersion, kind string) any {
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}
	case "v1 Service":
		return &corev1.Service{}
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}
	case "v1 Secret":
		return &corev1.Secret{}
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1 PrometheusRule":
		return &monitoringv1.PrometheusRule{}
	}
	return nil
}

// renderChart renders the chart with the values file (none: the chart's
// defaults) and returns the manifests by template name, NOTES.txt
// included.
func renderChart(valuesFile string) (map[string]string, error) {
	return renderAs(valuesFile, "")
}

// renderAs renders as renderChart does, with the release's Service (the
// managed-by label) set to service unless that is empty ("Helm").
func renderAs(valuesFile, service string) (map[string]string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	vals := chartutil.Values{}
	if valuesFile != "" {
		if vals, err = chartutil.ReadValuesFile(valuesFile); err != nil {
			return nil, err
		}
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, Revision: 1, IsInstall: true,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	if service != "" {
		rv["Release"].(map[string]any)["Service"] = service
	}
	return engine.Render(ch, rv)
}

// manifest joins the rendered objects in template name order into one
// YAML stream, as helm template prints them, NOTES.txt left out.
func manifest(rendered map[string]string) []string {
	names := make([]string, 0, len(rendered))
	for name := range rendered {
		names = append(names, name)
	}
	sort.Strings(names)
	var docs []string
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		for _, d := range splitYAML(rendered[name]) {
			docs = append(docs, "# Source: "+name+"\n"+d)
		}
	}
	return docs
}

// splitYAML splits a YAML stream into its documents, empty ones dropped.
func splitYAML(s string) []string {
	var docs []string
	for _, d := range strings.Split("\n"+s, "\n---") {
		d = strings.TrimLeft(d, "\n")
		if strings.TrimSpace(stripComments(d)) == "" {
			continue
		}
		docs = append(docs, strings.TrimRight(d, "\n")+"\n")
	}
	return docs
}

// stripComments drops the lines that are only a YAML comment.
func stripComments(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// decodeStrict converts a YAML document to JSON, refusing duplicate keys,
// and decodes it into obj as the API server would in strict mode:
// field names case-sensitive, an unknown field an error.
func decodeStrict(y string, obj any) error {
	j, err := yaml.YAMLToJSONStrict([]byte(y))
	if err != nil {
		return err
	}
	strictErrs, err := kjson.UnmarshalStrict(j, obj)
	if err != nil {
		return err
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, len(strictErrs))
		for i, e := range strictErrs {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("strict decoding: %s", strings.Join(msgs, "; "))
	}
	return nil
}

// decodeAll decodes every document of a rendering strictly into its
// Kubernetes type.
func decodeAll(docs []string) (objects, error) {
	var objs objects
	for _, d := range docs {
		tmpl, _, _ := strings.Cut(strings.TrimPrefix(d, "# Source: "), "\n")
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(d), &tm); err != nil {
			return nil, fmt.Errorf("%s: %v", tmpl, err)
		}
		obj := newObject(tm.APIVersion, tm.Kind)
		if obj == nil {
			return nil, fmt.Errorf("%s: unexpected object %s %s", tmpl, tm.APIVersion, tm.Kind)
		}
		if err := decodeStrict(d, obj); err != nil {
			return nil, fmt.Errorf("%s: %s %s: %v", tmpl, tm.APIVersion, tm.Kind, err)
		}
		objs = append(objs, doc{template: tmpl, yaml: d, obj: obj})
	}
	return objs, nil
}

// valuesFiles are the values files the chart is tested with: its
// defaults ("") and every file in its ci directory.
func valuesFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 5 {
		t.Fatalf("found %d values files in the chart's ci directory, want at least 5", len(files))
	}
	return append([]string{""}, files...)
}

// caseName names a values file in subtest names.
func caseName(valuesFile string) string {
	if valuesFile == "" {
		return "defaults"
	}
	return strings.TrimSuffix(filepath.Base(valuesFile), "-values.yaml")
}

// renderDecoded renders the chart with valuesFile and decodes every
// object strictly, failing t on any error.
func renderDecoded(t *testing.T, valuesFile string) (objects, map[string]string) {
	t.Helper()
	rendered, err := renderChart(valuesFile)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	objs, err := decodeAll(manifest(rendered))
	if err != nil {
		t.Fatal(err)
	}
	return objs, rendered
}

// one returns the only object of type T, failing t unless there is
// exactly one.
func one[T any](t *testing.T, objs objects) *T {
	t.Helper()
	all := every[T](objs)
	if len(all) != 1 {
		t.Fatalf("rendered %d objects of type %T, want 1", len(all), new(T))
	}
	return all[0]
}

// every returns the objects of type T.
func every[T any](objs objects) []*T {
	var out []*T
	for _, d := range objs {
		if o, ok := d.obj.(*T); ok {
			out = append(out, o)
		}
	}
	return out
}

// readFile reads a file, failing t if it cannot.
func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestStrictDecodingRefuses: the decoding the chart's objects go through
// refuses an unknown field, a field spelt in the wrong case, and a key
// given twice, so that a typo in a template fails the tests.
func TestStrictDecodingRefuses(t *testing.T) {
	const ok = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: w}\nspec:\n  replicas: 2\n"
	if err := decodeStrict(ok, &appsv1.Deployment{}); err != nil {
		t.Fatalf("a valid Deployment: %v", err)
	}
	for _, bad := range []string{
		ok + "  replica: 2\n",
		strings.Replace(ok, "replicas", "Replicas", 1),
		ok + "  replicas: 3\n",
		ok + "  template: {spec: {containers: [{name: w, image: w, securityContext: {readOnlyRootFileSystem: true}}]}}\n",
	} {
		if err := decodeStrict(bad, &appsv1.Deployment{}); err == nil {
			t.Errorf("decoded without error:\n%s", bad)
		}
	}
}
