package helmtest

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// TestChartRendersStrictly renders the chart for its defaults and every
// values file in its ci directory, decodes every object strictly into its
// API type, and checks what every rendering must have: the locked-down
// security context, probes on weir serve's HTTP port, a grace period above
// the shutdown timeout, selectors that select the pods, and references to
// Secrets and ConfigMaps that exist (rendered, or named as existing).
func TestChartRendersStrictly(t *testing.T) {
	for _, vf := range valuesFiles(t) {
		t.Run(caseName(vf), func(t *testing.T) {
			objs, rendered := renderDecoded(t, vf)
			if notes := rendered["weir/templates/NOTES.txt"]; !strings.Contains(notes, "weir") {
				t.Errorf("NOTES.txt renders empty: %q", notes)
			}
			checkCommon(t, objs)
			check, ok := perCase[caseName(vf)]
			if !ok {
				t.Fatalf("no checks for %s: add them to perCase", vf)
			}
			check(t, objs)
		})
	}
}

// perCase checks what each values file is for.
var perCase = map[string]func(t *testing.T, objs objects){
	"defaults": func(t *testing.T, objs objects) {
		d := one[appsv1.Deployment](t, objs)
		c := d.Spec.Template.Spec.Containers[0]
		if c.Image != "weir:0.1.0" || c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("image %q, pull policy %q; want weir:0.1.0 (the appVersion), IfNotPresent", c.Image, c.ImagePullPolicy)
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
			t.Errorf("replicas %v, want 2", d.Spec.Replicas)
		}
		wantEnvFromSecret(t, c, "WEIR_REDIS", "weir", "redis-url")
		wantNoEnv(t, c, "WEIR_ADMIN_TOKEN")
		s := one[corev1.Secret](t, objs)
		if s.StringData["redis-url"] != "redis://redis:6379" || len(s.StringData) != 1 {
			t.Errorf("secret %v, want only redis-url", s.StringData)
		}
		if got := len(d.Spec.Template.Spec.TopologySpreadConstraints); got != 2 {
			t.Errorf("%d topology spread constraints, want zone and hostname", got)
		}
		for _, tsc := range d.Spec.Template.Spec.TopologySpreadConstraints {
			if tsc.WhenUnsatisfiable != corev1.ScheduleAnyway {
				t.Errorf("topology spread over %s: %s, want ScheduleAnyway", tsc.TopologyKey, tsc.WhenUnsatisfiable)
			}
		}
		if p := one[policyv1.PodDisruptionBudget](t, objs); p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() != 1 {
			t.Errorf("PDB maxUnavailable %v, want 1", p.Spec.MaxUnavailable)
		}
		if *d.Spec.Template.Spec.TerminationGracePeriodSeconds != 30 {
			t.Errorf("terminationGracePeriodSeconds %d, want 30 (25s timeout + 5)", *d.Spec.Template.Spec.TerminationGracePeriodSeconds)
		}
		wantArgs(t, c, "--config=/etc/weir/config/weir.yaml", "--http=:8080", "--grpc=:8081", "--shutdown-delay=5s", "--shutdown-timeout=25s")
		wantNone[autoscalingv2.HorizontalPodAutoscaler](t, objs)
		wantNone[monitoringv1.ServiceMonitor](t, objs)
		wantNone[monitoringv1.PrometheusRule](t, objs)
		one[corev1.ServiceAccount](t, objs)
	},
	"existing-secrets": func(t *testing.T, objs objects) {
		c := one[appsv1.Deployment](t, objs).Spec.Template.Spec.Containers[0]
		wantEnvFromSecret(t, c, "WEIR_REDIS", "weir-redis", "url")
		wantEnvFromSecret(t, c, "WEIR_ADMIN_TOKEN", "weir-admin", "token")
		wantNone[corev1.Secret](t, objs)
		cm := one[corev1.ConfigMap](t, objs)
		if !strings.Contains(cm.Data["weir.yaml"], "prefix: shop") {
			t.Errorf("weir.yaml lacks the values' store prefix:\n%s", cm.Data["weir.yaml"])
		}
	},
	"envoy": func(t *testing.T, objs objects) {
		d := one[appsv1.Deployment](t, objs)
		c := d.Spec.Template.Spec.Containers[0]
		wantArgs(t, c, "--envoy-config=/etc/weir/envoy")
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--config") {
				t.Errorf("arg %q with config: null", a)
			}
		}
		cm := one[corev1.ConfigMap](t, objs)
		if cm.Name != "weir-envoy" || len(cm.Data) != 2 || cm.Data["ratelimit.yaml"] == "" || cm.Data["internal.yml"] == "" {
			t.Errorf("envoy ConfigMap %s holds %d files, want weir-envoy with ratelimit.yaml and internal.yml", cm.Name, len(cm.Data))
		}
		wantMount(t, c, "envoy", "/etc/weir/envoy")
	},
	"tls": func(t *testing.T, objs objects) {
		d := one[appsv1.Deployment](t, objs)
		c := d.Spec.Template.Spec.Containers[0]
		wantArgs(t, c, "--tls-cert=/etc/weir/tls/tls.crt", "--tls-key=/etc/weir/tls/tls.key")
		for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
			if p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
				t.Errorf("probe %+v: want HTTPS", p.ProbeHandler)
			}
		}
		wantMount(t, c, "tls", "/etc/weir/tls")
		wantSecretVolume(t, d, "tls", "weir-tls")
		if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds != 5 {
			t.Errorf("lifecycle %+v, want a 5-second preStop sleep", c.Lifecycle)
		}
		if *d.Spec.Template.Spec.TerminationGracePeriodSeconds != 60 {
			t.Errorf("terminationGracePeriodSeconds %d, want the values' 60", *d.Spec.Template.Spec.TerminationGracePeriodSeconds)
		}
		wantEnvFromSecret(t, c, "WEIR_ADMIN_TOKEN", "weir", "admin-token")
		if s := one[corev1.Secret](t, objs); s.StringData["admin-token"] != "change-me-to-a-long-random-token" {
			t.Errorf("secret %v lacks the admin token", s.StringData)
		}
		for _, p := range one[corev1.Service](t, objs).Spec.Ports {
			if p.Name == "http" && (p.AppProtocol == nil || *p.AppProtocol != "https") {
				t.Errorf("service port http: appProtocol %v, want https", p.AppProtocol)
			}
		}
	},
	"mtls": func(t *testing.T, objs objects) {
		c := one[appsv1.Deployment](t, objs).Spec.Template.Spec.Containers[0]
		wantArgs(t, c, "--tls-client-ca=/etc/weir/tls/ca.crt")
		for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
			if p.TCPSocket == nil || p.TCPSocket.Port.String() != "http" {
				t.Errorf("probe %+v: want a TCP probe of port http", p.ProbeHandler)
			}
		}
		sm := one[monitoringv1.ServiceMonitor](t, objs)
		ep := sm.Spec.Endpoints[0]
		if ep.Scheme == nil || ep.Scheme.String() != "https" || ep.TLSConfig == nil || ep.TLSConfig.Cert.Secret == nil || ep.TLSConfig.KeySecret == nil {
			t.Errorf("ServiceMonitor endpoint %+v: want https with a client certificate", ep)
		}
	},
	"monitoring": func(t *testing.T, objs objects) {
		d := one[appsv1.Deployment](t, objs)
		if d.Spec.Replicas != nil {
			t.Errorf("replicas %d with autoscaling on: the HPA owns the count", *d.Spec.Replicas)
		}
		h := one[autoscalingv2.HorizontalPodAutoscaler](t, objs)
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas != 3 || h.Spec.MaxReplicas != 12 || len(h.Spec.Metrics) != 2 {
			t.Errorf("HPA min %v max %d metrics %d, want 3, 12, 2", h.Spec.MinReplicas, h.Spec.MaxReplicas, len(h.Spec.Metrics))
		}
		if h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.Name != d.Name {
			t.Errorf("HPA scales %+v, want Deployment %s", h.Spec.ScaleTargetRef, d.Name)
		}
		if p := one[policyv1.PodDisruptionBudget](t, objs); p.Spec.MinAvailable == nil || p.Spec.MinAvailable.IntValue() != 2 || p.Spec.MaxUnavailable != nil {
			t.Errorf("PDB %+v, want minAvailable 2 only", p.Spec)
		}
		sm := one[monitoringv1.ServiceMonitor](t, objs)
		if sm.Labels["release"] != "prometheus" || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("ServiceMonitor %+v: want port http, /metrics, label release", sm)
		}
		svc := one[corev1.Service](t, objs)
		if !labels.SelectorFromSet(sm.Spec.Selector.MatchLabels).Matches(labels.Set(svc.Labels)) {
			t.Errorf("ServiceMonitor selector %v does not select the Service's labels %v", sm.Spec.Selector.MatchLabels, svc.Labels)
		}
		checkPrometheusRule(t, one[monitoringv1.PrometheusRule](t, objs))
	},
	"minimal": func(t *testing.T, objs objects) {
		d := one[appsv1.Deployment](t, objs)
		ps := d.Spec.Template.Spec
		if len(ps.TopologySpreadConstraints) != 0 || ps.ServiceAccountName != "default" {
			t.Errorf("spread %v, service account %q; want none, default", ps.TopologySpreadConstraints, ps.ServiceAccountName)
		}
		wantNoEnv(t, ps.Containers[0], "WEIR_REDIS")
		wantNone[corev1.Secret](t, objs)
		wantNone[corev1.ConfigMap](t, objs)
		wantNone[policyv1.PodDisruptionBudget](t, objs)
		wantNone[corev1.ServiceAccount](t, objs)
	},
}

// checkCommon checks what every rendering must have.
func checkCommon(t *testing.T, objs objects) {
	t.Helper()
	d := one[appsv1.Deployment](t, objs)
	ps := d.Spec.Template.Spec
	if !labels.SelectorFromSet(d.Spec.Selector.MatchLabels).Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the Deployment's selector %v does not select its pods %v", d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	}
	podLabels := labels.Set(d.Spec.Template.Labels)

	// Pod security: non-root 65532, a group for the volumes, RuntimeDefault seccomp.
	psc := ps.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 ||
		psc.FSGroup == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v: want runAsNonRoot, runAsUser 65532, fsGroup, seccomp RuntimeDefault", psc)
	}
	if len(ps.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(ps.Containers))
	}
	c := ps.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
		sc.Privileged != nil && *sc.Privileged {
		t.Errorf("container securityContext %+v: want a read-only root, no privilege escalation, every capability dropped", sc)
	}

	// Probes: liveness /healthz, readiness /readyz, on the container port
	// weir serve's --http listens on (or that port by TCP under mutual TLS).
	httpPort := containerPort(t, c, "http")
	wantArgs(t, c, fmt.Sprintf("--http=:%d", httpPort), fmt.Sprintf("--grpc=:%d", containerPort(t, c, "grpc")))
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
		switch {
		case p.probe == nil:
			t.Errorf("no probe for %s", p.path)
		case p.probe.HTTPGet != nil:
			if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
				t.Errorf("probe GET %s on port %s, want %s on port http", p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path)
			}
		case p.probe.TCPSocket != nil:
			if !hasArgPrefix(c, "--tls-client-ca=") {
				t.Errorf("TCP probe instead of GET %s without mutual TLS", p.path)
			}
		default:
			t.Errorf("probe for %s is neither GET nor TCP: %+v", p.path, p.probe.ProbeHandler)
		}
	}

	// The grace period covers the preStop sleep and the whole shutdown.
	timeout, err := time.ParseDuration(argValue(c, "--shutdown-timeout"))
	if err != nil {
		t.Fatalf("--shutdown-timeout: %v", err)
	}
	delay, err := time.ParseDuration(argValue(c, "--shutdown-delay"))
	if err != nil || delay >= timeout {
		t.Errorf("--shutdown-delay %v (%v), want below the timeout %v", delay, err, timeout)
	}
	var preStop time.Duration
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if g := ps.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= preStop+timeout {
		t.Errorf("terminationGracePeriodSeconds %v, want above preStop %v + shutdown timeout %v", g, preStop, timeout)
	}

	// A config change rolls the pods.
	for _, a := range []string{"checksum/config", "checksum/secret"} {
		if len(d.Spec.Template.Annotations[a]) != 64 {
			t.Errorf("pod annotation %s = %q, want a sha256", a, d.Spec.Template.Annotations[a])
		}
	}

	// The Service selects the pods and exposes http and grpc by name.
	svc := one[corev1.Service](t, objs)
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("the Service's selector %v does not select the pods %v", svc.Spec.Selector, podLabels)
	}
	ports := map[string]string{}
	for _, p := range svc.Spec.Ports {
		ports[p.Name] = p.TargetPort.String()
	}
	if ports["http"] != "http" || ports["grpc"] != "grpc" || len(ports) != 2 {
		t.Errorf("service ports %v, want http and grpc to the named container ports", ports)
	}
	for _, p := range every[policyv1.PodDisruptionBudget](objs) {
		if !labels.SelectorFromSet(p.Spec.Selector.MatchLabels).Matches(podLabels) {
			t.Errorf("the PDB's selector %v does not select the pods", p.Spec.Selector.MatchLabels)
		}
	}

	// Every Secret and ConfigMap the pod uses is rendered or named in the
	// values as one of the user's own.
	rendered := map[string]bool{}
	for _, s := range every[corev1.Secret](objs) {
		rendered["Secret/"+s.Name] = true
	}
	for _, cm := range every[corev1.ConfigMap](objs) {
		rendered["ConfigMap/"+cm.Name] = true
	}
	external := map[string]bool{"Secret/weir-redis": true, "Secret/weir-admin": true, "Secret/weir-tls": true}
	var refs []string
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			refs = append(refs, "Secret/"+e.ValueFrom.SecretKeyRef.Name)
		}
	}
	for _, v := range ps.Volumes {
		switch {
		case v.Secret != nil:
			refs = append(refs, "Secret/"+v.Secret.SecretName)
		case v.ConfigMap != nil:
			refs = append(refs, "ConfigMap/"+v.ConfigMap.Name)
		}
	}
	for _, r := range refs {
		if !rendered[r] && !external[r] {
			t.Errorf("the pod uses %s, which is neither rendered nor one the values name", r)
		}
	}
	// Every mount has its volume, and the root file system's only
	// writable place is the /tmp emptyDir.
	vols := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		vols[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			t.Errorf("mount %s has no volume", m.Name)
			continue
		}
		if v.EmptyDir == nil && !m.ReadOnly {
			t.Errorf("mount %s at %s is writable", m.Name, m.MountPath)
		}
	}
}

// checkPrometheusRule checks that the PrometheusRule carries the groups of
// examples/prometheus/recording.yml then alerts.yml, which promtool tests.
func checkPrometheusRule(t *testing.T, pr *monitoringv1.PrometheusRule) {
	t.Helper()
	var want []monitoringv1.RuleGroup
	for _, f := range []string{"recording.yml", "alerts.yml"} {
		var file struct {
			Groups []monitoringv1.RuleGroup `json:"groups"`
		}
		if err := decodeStrict(string(readFile(t, filepath.Join(repoRoot, "examples/prometheus", f))), &file); err != nil {
			t.Fatalf("examples/prometheus/%s: %v", f, err)
		}
		want = append(want, file.Groups...)
	}
	if !reflect.DeepEqual(pr.Spec.Groups, want) {
		got, _ := yaml.Marshal(pr.Spec.Groups)
		exp, _ := yaml.Marshal(want)
		t.Errorf("PrometheusRule groups differ from examples/prometheus:\ngot:\n%s\nwant:\n%s", got, exp)
	}
	alerts := 0
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts++
				if !strings.Contains(r.Annotations["summary"], "{{ $") {
					t.Errorf("alert %s's summary %q lost its Prometheus template", r.Alert, r.Annotations["summary"])
				}
			}
		}
	}
	if alerts < 8 {
		t.Errorf("%d alerts in the PrometheusRule, want the 8 of alerts.yml", alerts)
	}
}

// TestChartRuleFilesMatchExamples: the chart's copies of the Prometheus
// rules are byte for byte examples/prometheus's, the files promtool tests.
func TestChartRuleFilesMatchExamples(t *testing.T) {
	for _, f := range []string{"alerts.yml", "recording.yml"} {
		chartCopy := readFile(t, filepath.Join(chartDir, "files", f))
		tested := readFile(t, filepath.Join(repoRoot, "examples/prometheus", f))
		if string(chartCopy) != string(tested) {
			t.Errorf("deploy/helm/weir/files/%s differs from examples/prometheus/%s: cp examples/prometheus/%s deploy/helm/weir/files/", f, f, f)
		}
	}
}

// TestConfigChangeRollsPods: a different weir.yaml changes the pods'
// config checksum, and a different admin token their secret checksum.
func TestConfigChangeRollsPods(t *testing.T) {
	base := one[appsv1.Deployment](t, first(renderDecoded(t, ""))).Spec.Template.Annotations
	changed := writeValues(t, "config:\n  rules:\n    - {name: api, limit: 50/s}\nadminToken:\n  value: another-long-admin-token\n")
	got := one[appsv1.Deployment](t, first(renderDecoded(t, changed))).Spec.Template.Annotations
	for _, a := range []string{"checksum/config", "checksum/secret"} {
		if got[a] == base[a] {
			t.Errorf("%s unchanged by a change of its content", a)
		}
	}
}

// TestChartRefusesBadShutdown: a grace period that does not cover the
// shutdown, or a delay not below the timeout, fails the rendering.
func TestChartRefusesBadShutdown(t *testing.T) {
	for _, v := range []string{
		"terminationGracePeriodSeconds: 25\n",
		"shutdown: {preStopSleepSeconds: 10}\nterminationGracePeriodSeconds: 35\n",
		"shutdown: {delaySeconds: 30, timeoutSeconds: 30}\n",
		"tls: {enabled: true}\n",
		"envoy: {files: {rules.json: '{}'}}\n",
	} {
		if _, err := renderChart(writeValues(t, v)); err == nil {
			t.Errorf("values %q rendered; want an error", v)
		}
	}
}

// TestChartLints runs helm lint's checks (pkg/lint) for every values file;
// a warning or an error fails.
func TestChartLints(t *testing.T) {
	for _, vf := range valuesFiles(t) {
		vals := map[string]any{}
		if vf != "" {
			v, err := os.ReadFile(vf)
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal(v, &vals); err != nil {
				t.Fatal(err)
			}
		}
		res := lint.All(chartDir, vals, namespace, false)
		for _, m := range res.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: helm lint: %s", caseName(vf), m.Error())
			}
		}
	}
}

// first returns its first argument.
func first[A, B any](a A, _ B) A { return a }

// writeValues writes a values file into the test's temporary directory.
func writeValues(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func wantNone[T any](t *testing.T, objs objects) {
	t.Helper()
	if n := len(every[T](objs)); n != 0 {
		t.Errorf("rendered %d objects of type %T, want none", n, new(T))
	}
}

func wantArgs(t *testing.T, c corev1.Container, args ...string) {
	t.Helper()
	for _, a := range args {
		if !contains(c.Args, a) {
			t.Errorf("args %q lack %q", c.Args, a)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func hasArgPrefix(c corev1.Container, prefix string) bool {
	for _, a := range c.Args {
		if strings.HasPrefix(a, prefix) {
			return true
		}
	}
	return false
}

// argValue returns the value of --name=value in the container's args.
func argValue(c corev1.Container, name string) string {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

func containerPort(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("no container port %s in %v", name, c.Ports)
	return 0
}

func wantEnvFromSecret(t *testing.T, c corev1.Container, name, secret, key string) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name != name {
			continue
		}
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
			e.ValueFrom.SecretKeyRef.Name != secret || e.ValueFrom.SecretKeyRef.Key != key {
			t.Errorf("env %s = %+v, want Secret %s key %s", name, e, secret, key)
		}
		return
	}
	t.Errorf("no env %s", name)
}

func wantNoEnv(t *testing.T, c corev1.Container, name string) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			t.Errorf("env %s set: %+v", name, e)
		}
	}
}

func wantMount(t *testing.T, c corev1.Container, volume, path string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.Name == volume && m.MountPath == path && m.ReadOnly {
			return
		}
	}
	t.Errorf("no read-only mount of %s at %s in %+v", volume, path, c.VolumeMounts)
}

func wantSecretVolume(t *testing.T, d *appsv1.Deployment, volume, secret string) {
	t.Helper()
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == volume && v.Secret != nil && v.Secret.SecretName == secret {
			return
		}
	}
	t.Errorf("no volume %s of Secret %s", volume, secret)
}
