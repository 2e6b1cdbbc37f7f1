//go:build fleet

package deploy

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The images of this run, built once by TestMain with deploy/compose/build.sh
// under a tag of their own, and removed at the end.
var (
	runID    = fmt.Sprintf("fleet%d%04d", os.Getpid(), rand.IntN(10000))
	tag      = runID
	weirImg  = "weir:" + tag
	redisImg = "weir-demo-redis:" + tag
)

func TestMain(m *testing.M) {
	if _, err := exec.LookPath("docker"); err != nil || exec.Command("docker", "info").Run() != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "deploy: the fleet tests need a running Docker Engine, and CI=true")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "deploy: no Docker Engine; skipping the fleet tests")
		os.Exit(0)
	}
	build := exec.Command("./compose/build.sh")
	build.Env = append(os.Environ(), "WEIR_DEMO_TAG="+tag)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	code := 1
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "deploy: building the images:", err)
	} else {
		code = m.Run()
	}
	for _, img := range []string{weirImg, redisImg, "weir-demo-nginx:" + tag, "weir-demo-app:" + tag} {
		exec.Command("docker", "rmi", "-f", img).Run()
	}
	os.Exit(code)
}

// docker runs the docker command and returns its trimmed stdout; a
// failure ends the test with its stderr.
func docker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := dockerErr(args...)
	if err != nil {
		t.Fatalf("docker %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func dockerErr(args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("docker", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return strings.TrimSpace(stdout.String()), fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// runWeir starts weir's image, detached, on a read-only root with no
// capabilities, publishing 8080 and 8081 on loopback; the container goes
// (with its logs in the test's output on failure) when the test ends.
func runWeir(t *testing.T, dockerArgs []string, weirArgs ...string) (id, httpBase, grpcAddr string) {
	t.Helper()
	args := append([]string{"run", "-d", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"-p", "127.0.0.1::8080", "-p", "127.0.0.1::8081"}, dockerArgs...)
	args = append(append(args, weirImg), weirArgs...)
	id = docker(t, args...)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command("docker", "logs", id).CombinedOutput()
			t.Logf("container logs:\n%s", logs)
		}
		exec.Command("docker", "rm", "-f", "-v", id).Run()
	})
	httpBase = "http://" + hostPort(t, id, "8080/tcp")
	grpcAddr = hostPort(t, id, "8081/tcp")
	waitFor(t, httpBase+"/readyz", http.StatusOK)
	return id, httpBase, grpcAddr
}

// hostPort is the loopback address docker published a container port on.
func hostPort(t *testing.T, id, port string) string {
	t.Helper()
	out := docker(t, "port", id, port)
	return strings.Replace(strings.Fields(out)[0], "0.0.0.0", "127.0.0.1", 1)
}

// waitFor polls url until it answers status, for up to 30 seconds.
func waitFor(t *testing.T, url string, status int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == status {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: no %d within 30s (last: %s)", url, status, last)
}

// check asks weir to decide one hit of rule for key and returns whether it
// was allowed.
func check(t *testing.T, c *http.Client, base, rule, key string) bool {
	t.Helper()
	body := fmt.Sprintf(`{"rule":%q,"key":%q}`, rule, key)
	resp, err := c.Post(base+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res struct {
		Allowed bool `json:"allowed"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		t.Fatalf("/v1/check %s: %s: %v", body, resp.Status, err)
	}
	return res.Allowed
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}

// TestImageHoldsOnlyTheBinary: the image is two layers of its own (FROM
// scratch: no base image), holding /weir, /etc/passwd and /etc/group and
// nothing else; it runs as 65532, refuses root, exposes 8080 and 8081 and
// carries the OCI labels.
func TestImageHoldsOnlyTheBinary(t *testing.T) {
	var info []struct {
		Config struct {
			User         string
			Entrypoint   []string
			Env          []string
			ExposedPorts map[string]any
			Labels       map[string]string
			Healthcheck  struct{ Test []string }
			StopSignal   string
		}
		RootFS struct{ Layers []string }
	}
	if err := json.Unmarshal([]byte(docker(t, "image", "inspect", weirImg)), &info); err != nil || len(info) != 1 {
		t.Fatalf("docker image inspect: %v", err)
	}
	cfg := info[0].Config
	if cfg.User != "65532:65532" {
		t.Errorf("user %q; want 65532:65532", cfg.User)
	}
	if strings.Join(cfg.Entrypoint, " ") != "/weir serve" {
		t.Errorf("entrypoint %q", cfg.Entrypoint)
	}
	if !strings.Contains(strings.Join(cfg.Env, " "), "WEIR_REFUSE_ROOT=true") {
		t.Errorf("env %q lacks WEIR_REFUSE_ROOT=true", cfg.Env)
	}
	var ports []string
	for p := range cfg.ExposedPorts {
		ports = append(ports, p)
	}
	sort.Strings(ports)
	if strings.Join(ports, " ") != "8080/tcp 8081/tcp" {
		t.Errorf("exposed ports %v", ports)
	}
	for _, l := range []string{"source", "version", "revision", "licenses", "title", "created"} {
		if cfg.Labels["org.opencontainers.image."+l] == "" {
			t.Errorf("no org.opencontainers.image.%s label", l)
		}
	}
	if cfg.Labels["org.opencontainers.image.licenses"] != "Apache-2.0" {
		t.Errorf("licenses label %q", cfg.Labels["org.opencontainers.image.licenses"])
	}
	if cfg.StopSignal != "SIGTERM" || len(cfg.Healthcheck.Test) == 0 {
		t.Errorf("stop signal %q, healthcheck %q", cfg.StopSignal, cfg.Healthcheck.Test)
	}
	if n := len(info[0].RootFS.Layers); n != 3 {
		t.Errorf("%d layers; want the 2 COPY layers and the ADD of /bin/ratelimit of FROM scratch", n)
	}

	// Every file of every layer, from docker save's archive.
	saved, err := exec.Command("docker", "save", weirImg).Output()
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	outer := tar.NewReader(bytes.NewReader(saved))
	for {
		h, err := outer.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(h.Name) != "layer.tar" {
			continue
		}
		inner := tar.NewReader(outer)
		for {
			ih, err := inner.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			switch ih.Typeflag {
			case tar.TypeDir:
			case tar.TypeSymlink:
				files = append(files, fmt.Sprintf("/%s -> %s %d:%d", ih.Name, ih.Linkname, ih.Uid, ih.Gid))
			default:
				files = append(files, fmt.Sprintf("/%s %o %d:%d", ih.Name, ih.Mode&0o7777, ih.Uid, ih.Gid))
			}
		}
	}
	sort.Strings(files)
	if want := "/bin/ratelimit -> /weir 0:0,/etc/group 644 0:0,/etc/passwd 644 0:0,/weir 755 0:0"; strings.Join(files, ",") != want {
		t.Errorf("the image holds %q; want %q", files, want)
	}
}

// TestImageRefusesRoot: docker run --user 0 stops with weir's reason.
func TestImageRefusesRoot(t *testing.T) {
	out, err := exec.Command("docker", "run", "--rm", "--user", "0", weirImg).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "refusing to run as root") {
		t.Fatalf("docker run --user 0: %v\n%s", err, out)
	}
}

// TestImageServes: on a read-only root, with no capabilities, the image
// becomes ready and healthy, decides over HTTP (the built-in demo rules,
// memory store) and answers gRPC health.
func TestImageServes(t *testing.T) {
	id, base, grpcAddr := runWeir(t, []string{"--health-interval", "1s"})
	if !check(t, http.DefaultClient, base, "demo-ip", "203.0.113.7") {
		t.Fatal("the first check was not allowed")
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health: %v %v", hr, err)
	}
	// The image's HEALTHCHECK (weir healthcheck, no shell) passes.
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := docker(t, "inspect", "-f", "{{.State.Health.Status}}", id)
		if s == "healthy" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health %q after 20s", s)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if u := docker(t, "inspect", "-f", "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}}", id); u != "65532:65532 true" {
		t.Fatalf("user and read-only root: %q", u)
	}
}

// TestImageConfigAndRedis: a mounted weir.yaml (WEIR_CONFIG), WEIR_*
// variables and flags all configure the image, and on a read-only root it
// decides with Redis (the demo's redis-server image on a private network).
func TestImageConfigAndRedis(t *testing.T) {
	network := "weir-" + runID + "-net"
	docker(t, "network", "create", network)
	t.Cleanup(func() { exec.Command("docker", "network", "rm", network).Run() })
	redisName := "weir-" + runID + "-redis"
	docker(t, "run", "-d", "--name", redisName, "--network", network, "--read-only", "--tmpfs", "/tmp",
		"--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		redisImg, "--bind", "0.0.0.0", "--port", "6379", "--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", "/tmp")
	t.Cleanup(func() { exec.Command("docker", "rm", "-f", "-v", redisName).Run() })

	dir := t.TempDir()
	cfg := filepath.Join(dir, "weir.yaml")
	if err := os.WriteFile(cfg, []byte("rules:\n  - name: fleet\n    limit: 3/m\n    algorithm: sliding_log\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	id, base, _ := runWeir(t, []string{"--network", network, "-v", cfg + ":/etc/weir/weir.yaml:ro",
		"-e", "WEIR_CONFIG=/etc/weir/weir.yaml", "-e", "WEIR_REDIS=redis://" + redisName + ":6379/0", "-e", "WEIR_INSTANCE_ID=from-env"},
		"--log-format", "json")
	waitFor(t, base+"/healthz/store", http.StatusOK)

	var rules struct{ Rules []struct{ Name string } }
	getJSON(t, base+"/v1/rules", &rules)
	if len(rules.Rules) != 1 || rules.Rules[0].Name != "fleet" {
		t.Fatalf("rules %+v; want the mounted file's", rules.Rules)
	}
	var snap struct {
		Instance struct{ ID string }
		Store    map[string]any
	}
	getJSON(t, base+"/v1/dashboard/snapshot", &snap)
	if snap.Instance.ID != "from-env" {
		t.Errorf("instance %q; want WEIR_INSTANCE_ID's", snap.Instance.ID)
	}
	var store struct{ Store, Status string }
	getJSON(t, base+"/healthz/store", &store)
	if store.Store != "redis" || store.Status != "up" {
		t.Fatalf("store %+v; want redis, up", store)
	}
	allowed := 0
	for range 5 {
		if check(t, http.DefaultClient, base, "fleet", "k") {
			allowed++
		}
	}
	if allowed != 3 {
		t.Fatalf("%d of 5 allowed; want 3", allowed)
	}
	// The limit lives in Redis: a second instance sees it spent.
	_, base2, _ := runWeir(t, []string{"--network", network, "-v", cfg + ":/etc/weir/weir.yaml:ro",
		"-e", "WEIR_CONFIG=/etc/weir/weir.yaml", "-e", "WEIR_REDIS=redis://" + redisName + ":6379/0"})
	waitFor(t, base2+"/healthz/store", http.StatusOK)
	if check(t, http.DefaultClient, base2, "fleet", "k") {
		t.Fatal("a second instance on the same Redis allowed a spent key")
	}
	// --log-format json came from the command line.
	logs, _ := exec.Command("docker", "logs", id).CombinedOutput()
	if !bytes.Contains(logs, []byte(`"msg":"weir serve started"`)) {
		t.Errorf("no JSON log line in:\n%s", logs)
	}
}

// TestImageDrainsOnStop: under steady traffic, docker stop -t 30 (SIGTERM)
// turns /readyz 503 while weir keeps deciding for its shutdown delay, then
// weir exits 0 well within the grace period; no request sent before the
// stop began fails.
func TestImageDrainsOnStop(t *testing.T) {
	id, base, _ := runWeir(t, nil)
	type result struct {
		start time.Time
		err   error
	}
	results := make(chan result, 100000)
	done := make(chan struct{})
	finished := make(chan struct{})
	const workers = 4
	for w := range workers {
		go func() {
			defer func() { finished <- struct{}{} }()
			c := &http.Client{Timeout: 10 * time.Second}
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				start := time.Now()
				body := fmt.Sprintf(`{"rule":"demo-ip","key":"%d-%d"}`, w, i)
				resp, err := c.Post(base+"/v1/check", "application/json", strings.NewReader(body))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					// 200 allows, 429 refuses: either is an answer.
					if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
						err = fmt.Errorf("%s", resp.Status)
					}
				}
				results <- result{start, err}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	time.Sleep(time.Second)

	// While it drains, /readyz answers 503.
	unready := make(chan bool, 1)
	go func() {
		c := &http.Client{Timeout: time.Second}
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if resp, err := c.Get(base + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable {
					unready <- true
					return
				}
			}
		}
		unready <- false
	}()
	stopAt := time.Now()
	docker(t, "stop", "-t", "30", id)
	took := time.Since(stopAt)
	close(done)
	for range workers {
		<-finished
	}
	close(results)

	var before, after, failedBefore, okAfter int
	for r := range results {
		if r.start.Before(stopAt) {
			before++
			if r.err != nil {
				failedBefore++
				t.Errorf("a request sent %v before the stop failed: %v", stopAt.Sub(r.start), r.err)
			}
		} else {
			after++
			if r.err == nil {
				okAfter++
			}
		}
	}
	t.Logf("stop took %v; %d requests before it (%d failed), %d after (%d answered while draining)", took.Round(time.Millisecond), before, failedBefore, after, okAfter)
	if before == 0 || okAfter == 0 {
		t.Errorf("want requests answered before and during the drain: %d before, %d during", before, okAfter)
	}
	if !<-unready {
		t.Error("/readyz never answered 503 during the drain")
	}
	if code := docker(t, "inspect", "-f", "{{.State.ExitCode}}", id); code != "0" {
		t.Errorf("exit code %s; want 0 (a SIGKILL at the grace period's end gives 137)", code)
	}
	if took >= 30*time.Second {
		t.Errorf("docker stop took %v: the grace period ran out", took)
	}
}

// composeCmd is `docker compose` where the plugin exists, else
// docker-compose (Compose v1).
func composeCmd() []string {
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	return []string{"docker-compose"}
}

// freePort is a loopback TCP port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// metric is the sum of a counter's series whose labels include labels.
func metric(t *testing.T, base, name, labels string) int {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	re := regexp.MustCompile(`(?m)^` + name + `\{([^}]*)\} ([0-9.e+]+)$`)
	sum := 0
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		if strings.Contains(m[1], labels) {
			var v float64
			fmt.Sscan(m[2], &v)
			sum += int(v)
		}
	}
	return sum
}

// TestComposeSharesOneLimit brings the demo up (deploy/compose: nginx, the
// app, two weir instances, Redis) and sends 15 requests through nginx to a
// path limited to 10 a minute per client: exactly 10 reach the app and 5
// get 429, though nginx spreads the checks over both instances, and the
// dashboard shows both.
func TestComposeSharesOneLimit(t *testing.T) {
	project := "weir" + runID
	webPort, dashPort := freePort(t), freePort(t)
	compose := func(args ...string) (string, error) {
		cmdline := append(composeCmd(), append([]string{"-p", project, "-f", "compose/compose.yaml"}, args...)...)
		cmd := exec.Command(cmdline[0], cmdline[1:]...)
		cmd.Env = append(os.Environ(), "WEIR_DEMO_TAG="+tag, "WEIR_DEMO_PORT="+webPort, "WEIR_DEMO_DASHBOARD_PORT="+dashPort)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := compose("logs", "--no-color")
			t.Logf("compose logs:\n%s", out)
		}
		if out, err := compose("down", "-v", "--remove-orphans", "-t", "5"); err != nil {
			t.Errorf("compose down: %v\n%s", err, out)
		}
	})
	if out, err := compose("up", "-d"); err != nil {
		t.Fatalf("compose up: %v\n%s", err, out)
	}

	// weir-2 publishes no port: reach it at its address on the demo's network.
	id2, err := compose("ps", "-q", "weir-2")
	if err != nil {
		t.Fatal(err, id2)
	}
	ip2 := docker(t, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", strings.TrimSpace(id2))
	weir1, weir2 := "http://127.0.0.1:"+dashPort, "http://"+ip2+":8080"
	nginx := "http://127.0.0.1:" + webPort
	for _, b := range []string{weir1, weir2} {
		waitFor(t, b+"/healthz/store", http.StatusOK)
	}
	waitFor(t, nginx+"/", http.StatusOK) // not limited: the rule covers /api/

	codes := map[int]int{}
	for range 15 {
		resp, err := http.Get(nginx + "/api/hello")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
		switch resp.StatusCode {
		case http.StatusOK:
			if !bytes.Contains(body, []byte("hello from the app")) {
				t.Errorf("200 without the app's answer: %q", body)
			}
		case http.StatusTooManyRequests:
			if resp.Header.Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
		}
	}
	if codes[200] != 10 || codes[429] != 5 {
		t.Fatalf("status counts %v; want 10 × 200 and 5 × 429", codes)
	}

	a1, l1 := metric(t, weir1, "weir_decisions_total", `result="allowed",rule="api"`), metric(t, weir1, "weir_decisions_total", `result="limited",rule="api"`)
	a2, l2 := metric(t, weir2, "weir_decisions_total", `result="allowed",rule="api"`), metric(t, weir2, "weir_decisions_total", `result="limited",rule="api"`)
	t.Logf("weir-1 allowed %d limited %d; weir-2 allowed %d limited %d", a1, l1, a2, l2)
	if a1+a2 != 10 || l1+l2 != 5 || a1+l1 == 0 || a2+l2 == 0 {
		t.Errorf("decisions: weir-1 %d+%d, weir-2 %d+%d; want 10 allowed and 5 limited in all, some on each", a1, l1, a2, l2)
	}

	// The dashboard, on weir-1's published port, lists both instances.
	resp, err := http.Get(weir1 + "/")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("dashboard: %v %v", resp, err)
	}
	resp.Body.Close()
	var snap struct{ Instances []struct{ ID string } }
	deadline := time.Now().Add(15 * time.Second)
	for {
		getJSON(t, weir1+"/v1/dashboard/snapshot", &snap)
		var ids []string
		for _, in := range snap.Instances {
			ids = append(ids, in.ID)
		}
		sort.Strings(ids)
		if strings.Join(ids, ",") == "weir-1,weir-2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dashboard instances %v; want weir-1 and weir-2", ids)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
