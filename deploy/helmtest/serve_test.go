package helmtest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

var (
	weirOnce sync.Once
	weirBin  string
	weirErr  error
)

// weirBinary builds weir from the repository once per test binary.
func weirBinary(t *testing.T) string {
	t.Helper()
	weirOnce.Do(func() {
		dir, err := os.MkdirTemp("", "helmtest-weir-")
		if err != nil {
			weirErr = err
			return
		}
		weirBin = filepath.Join(dir, "weir")
		cmd := exec.Command("go", "build", "-o", weirBin, "./cmd/weir")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			weirErr = fmt.Errorf("go build ./cmd/weir: %v\n%s", err, out)
		}
	})
	if weirErr != nil {
		t.Fatal(weirErr)
	}
	return weirBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if weirBin != "" {
		os.RemoveAll(filepath.Dir(weirBin))
	}
	os.Exit(code)
}

// TestProbesServedByWeirServe runs the real weir serve as each values
// file's Deployment describes it: the rendered args and environment, its
// ConfigMaps and Secrets laid out as the kubelet mounts them (symlinks
// through ..data), its ports moved to free loopback ports. The readiness
// probe must then succeed, and the liveness probe too, speaking HTTP or
// HTTPS as rendered, or by TCP under mutual TLS (where a GET without a
// client certificate is refused, which is why the chart does not use one).
func TestProbesServedByWeirServe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs weir serve")
	}
	bin := weirBinary(t)
	redisURL := startRedis(t)
	for _, vf := range valuesFiles(t) {
		t.Run(caseName(vf), func(t *testing.T) {
			objs, _ := renderDecoded(t, vf)
			d := one[appsv1.Deployment](t, objs)
			p := newPod(t, objs, d, redisURL)
			p.start(t, bin)
			p.waitProbe(t, p.container.ReadinessProbe, 30*time.Second)
			if err := p.probe(p.container.LivenessProbe); err != nil {
				t.Errorf("liveness probe: %v", err)
			}
			// The Secrets reached weir serve: the Redis URL, the admin token.
			out := p.stderr.String()
			if redisURL != closedRedis && p.hasEnv("WEIR_REDIS") && !strings.Contains(out, `"store":"redis standalone `+strings.TrimPrefix(redisURL, "redis://")) {
				t.Errorf("weir serve does not use the Redis of WEIR_REDIS:\n%s", out)
			}
			if want := fmt.Sprintf(`"admin_api":%t`, p.hasEnv("WEIR_ADMIN_TOKEN")); !strings.Contains(out, want) {
				t.Errorf("weir serve's start does not log %s:\n%s", want, out)
			}
			if hasArgPrefix(p.container, "--tls-client-ca=") {
				get := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
					Path: "/readyz", Port: p.container.ReadinessProbe.TCPSocket.Port, Scheme: corev1.URISchemeHTTPS,
				}}}
				if err := p.probe(get); err == nil {
					t.Errorf("GET /readyz without a client certificate succeeded under mutual TLS")
				}
			}
		})
	}
}

// pod is one weir serve process laid out as a pod of the Deployment.
type pod struct {
	container corev1.Container
	dir       string
	args      []string
	env       []string
	ports     map[string]int // container port name -> loopback port
	stderr    syncBuffer
	cmd       *exec.Cmd
}

func newPod(t *testing.T, objs objects, d *appsv1.Deployment, redisURL string) *pod {
	t.Helper()
	ps := d.Spec.Template.Spec
	p := &pod{container: ps.Containers[0], dir: t.TempDir(), ports: map[string]int{}}
	c := p.container

	configMaps := map[string]*corev1.ConfigMap{}
	for _, cm := range every[corev1.ConfigMap](objs) {
		configMaps[cm.Name] = cm
	}
	secrets := map[string]*corev1.Secret{}
	for _, s := range every[corev1.Secret](objs) {
		secrets[s.Name] = s
	}

	// The volumes, where the container mounts them.
	vols := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		vols[v.Name] = v
	}
	mounts := map[string]string{} // mount path -> local directory
	for _, m := range c.VolumeMounts {
		v := vols[m.Name]
		local := filepath.Join(p.dir, "volumes", m.Name)
		switch {
		case v.EmptyDir != nil:
			mkdir(t, local)
		case v.ConfigMap != nil:
			cm, ok := configMaps[v.ConfigMap.Name]
			if !ok {
				t.Fatalf("volume %s: ConfigMap %s is not rendered", m.Name, v.ConfigMap.Name)
			}
			files := map[string][]byte{}
			for k, val := range cm.Data {
				files[k] = []byte(val)
			}
			if len(v.ConfigMap.Items) > 0 {
				picked := map[string][]byte{}
				for _, it := range v.ConfigMap.Items {
					b, ok := files[it.Key]
					if !ok {
						t.Fatalf("volume %s: ConfigMap %s has no key %s", m.Name, cm.Name, it.Key)
					}
					picked[it.Path] = b
				}
				files = picked
			}
			writeAtomic(t, local, files)
		case v.Secret != nil:
			writeAtomic(t, local, secretFiles(t, v.Secret.SecretName, secrets))
		default:
			t.Fatalf("volume %s: a kind this test cannot lay out", m.Name)
		}
		mounts[m.MountPath] = local
	}

	// The args: mount paths to local directories, listen ports to free
	// loopback ports.
	byPort := map[string]string{} // "8080" -> port name
	for _, cp := range c.Ports {
		byPort[strconv.Itoa(int(cp.ContainerPort))] = cp.Name
		p.ports[cp.Name] = freePort(t)
	}
	for _, a := range c.Args {
		name, val, ok := strings.Cut(a, "=")
		if ok && (name == "--http" || name == "--grpc") {
			portName, found := byPort[strings.TrimPrefix(val, ":")]
			if !found {
				t.Fatalf("%s listens on %s, which is no container port", name, val)
			}
			a = fmt.Sprintf("%s=127.0.0.1:%d", name, p.ports[portName])
		}
		if ok {
			for mp, local := range mounts {
				if val == mp || strings.HasPrefix(val, mp+"/") {
					a = name + "=" + local + strings.TrimPrefix(val, mp)
					break
				}
			}
		}
		p.args = append(p.args, a)
	}

	// The environment, from scratch: only what the pod spec sets.
	p.env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + p.dir, "TMPDIR=" + mounts["/tmp"]}
	for _, e := range c.Env {
		val := e.Value
		switch {
		case e.Name == "WEIR_REDIS":
			val = redisURL // the rendered URL names a host of the cluster
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			val = "weir-test-0"
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			val = string(secretFiles(t, ref.Name, secrets)[ref.Key])
			if val == "" {
				t.Fatalf("env %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
			}
		case e.ValueFrom != nil:
			t.Fatalf("env %s: a source this test cannot supply", e.Name)
		}
		p.env = append(p.env, e.Name+"="+val)
	}
	return p
}

// secretFiles returns a Secret's content: the rendered one, or for the
// Secrets the ci values name as the user's own, made-up content of the
// same shape (a fresh CA and serving certificate for weir-tls).
func secretFiles(t *testing.T, name string, rendered map[string]*corev1.Secret) map[string][]byte {
	t.Helper()
	if s, ok := rendered[name]; ok {
		files := map[string][]byte{}
		for k, v := range s.Data {
			files[k] = v
		}
		for k, v := range s.StringData {
			files[k] = []byte(v)
		}
		return files
	}
	switch name {
	case "weir-redis":
		return map[string][]byte{"url": []byte("set from the test's Redis")}
	case "weir-admin":
		return map[string][]byte{"token": []byte("a-test-admin-token-of-some-length\n")}
	case "weir-tls":
		return testCertificates(t)
	}
	t.Fatalf("Secret %s is neither rendered nor known to the test", name)
	return nil
}

// writeAtomic lays files out as the kubelet does for a ConfigMap or
// Secret volume: in a timestamped directory, reached through the symlink
// ..data, each file a symlink through it.
func writeAtomic(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	ts := "..2025_01_01_00_00_00.000000001"
	mkdir(t, filepath.Join(dir, ts))
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

func (p *pod) start(t *testing.T, bin string) {
	t.Helper()
	// The image's ENTRYPOINT is ["/weir", "serve"].
	p.cmd = exec.Command(bin, append([]string{"serve"}, p.args...)...)
	p.cmd.Env = p.env
	p.cmd.Dir = p.dir
	p.cmd.Stdout = &p.stderr
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { p.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("weir serve %q:\n%s", p.args, p.stderr.String())
		}
	})
}

// waitProbe runs the probe until it succeeds, failing t at the deadline
// or if weir serve exits.
func (p *pod) waitProbe(t *testing.T, pr *corev1.Probe, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := p.probe(pr)
		if err == nil {
			return
		}
		if p.cmd.ProcessState != nil || time.Now().After(deadline) {
			t.Fatalf("readiness probe: %v (weir serve exited: %v)", err, p.cmd.ProcessState != nil)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// probe runs a probe once as the kubelet would: a GET that must answer
// 2xx or 3xx (over HTTPS without verifying the certificate), or a TCP
// connect.
func (p *pod) probe(pr *corev1.Probe) error {
	if pr == nil {
		return fmt.Errorf("no probe")
	}
	var port string
	switch {
	case pr.HTTPGet != nil:
		port = pr.HTTPGet.Port.String()
	case pr.TCPSocket != nil:
		port = pr.TCPSocket.Port.String()
	default:
		return fmt.Errorf("probe %+v: neither GET nor TCP", pr.ProbeHandler)
	}
	local, ok := p.ports[port]
	if !ok {
		return fmt.Errorf("probe port %s is no named container port", port)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(local))
	if pr.TCPSocket != nil {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // as the kubelet's probes
	}}
	defer client.CloseIdleConnections()
	url := fmt.Sprintf("%s://%s%s", strings.ToLower(string(pr.HTTPGet.Scheme)), addr, pr.HTTPGet.Path)
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// closedRedis is the Redis URL used when redis-server is not installed.
const closedRedis = "redis://127.0.0.1:1"

// hasEnv reports whether the pod spec sets the environment variable.
func (p *pod) hasEnv(name string) bool {
	for _, e := range p.container.Env {
		if e.Name == name {
			return true
		}
	}
	return false
}

// syncBuffer is a bytes.Buffer safe for a writing process and a reading test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startRedis starts a redis-server for the test if one is installed and
// returns its URL; without one, the URL of a closed port (weir serve
// starts without its Redis, answering by on_error).
func startRedis(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return closedRedis
	}
	port := freePort(t)
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not listen on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "redis://" + addr
}

// testCertificates returns the files of a kubernetes.io/tls Secret with a
// CA: tls.crt and tls.key signed by ca.crt.
func testCertificates(t *testing.T) map[string][]byte {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "weir test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "weir"},
		DNSNames: []string{"weir", "localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"ca.crt":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
	}
}

// freePort returns a TCP port free on the loopback address.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}
