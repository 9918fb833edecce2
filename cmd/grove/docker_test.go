package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDockerCompose (GROVE_DOCKER=1; scripts/test.sh sets it where a docker
// engine and docker-compose answer): the FROM-scratch image and
// deploy/compose.yaml, as the README tells a user to run them. Three nodes,
// each in its own container with its own address and volume; `grove health`
// from inside a container is healthy; a container killed is reported dead,
// and started again it is alive (same volume, a higher incarnation).
func TestDockerCompose(t *testing.T) {
	if os.Getenv("GROVE_DOCKER") != "1" {
		t.Skip("GROVE_DOCKER=1 runs the container test (docker engine and docker-compose needed)")
	}
	// Beside the other parallel tests (see parallelTests): it takes no
	// host port (its containers have addresses of their own, on a docker
	// network only it uses), and its waits (90 s each) do not time what
	// they see. Sequential, it was 18 s alone, 30-40 s in CI, of this
	// package's critical path.
	t.Parallel()
	for _, tool := range []string{"docker", "docker-compose"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("GROVE_DOCKER=1 but %s is missing", tool)
		}
	}
	dir := t.TempDir()
	ctxDir := filepath.Join(dir, "image")
	if err := os.MkdirAll(filepath.Join(ctxDir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(ctxDir, "bin", "grove"), ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("static build: %v\n%s", err, out)
	}
	for _, f := range []string{"Dockerfile", ".dockerignore"} {
		copyFile(t, filepath.Join("..", "..", f), filepath.Join(ctxDir, f))
	}
	tag := fmt.Sprintf("grove:test-%d", os.Getpid())
	mustRun(t, 5*time.Minute, nil, "docker", "build", "-q", "-t", tag, ctxDir)
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", tag).Run() })

	deploy := filepath.Join(dir, "deploy")
	if err := os.MkdirAll(deploy, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"compose.yaml", "node-1.toml", "node-2.toml", "node-3.toml"} {
		copyFile(t, filepath.Join("..", "..", "deploy", f), filepath.Join(deploy, f))
	}
	key := mustRun(t, time.Minute, nil, filepath.Join(ctxDir, "bin", "grove"), "keygen")
	if err := os.WriteFile(filepath.Join(deploy, "cluster.key"), []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	project := fmt.Sprintf("grovetest%d", os.Getpid())
	env := []string{"GROVE_IMAGE=" + tag}
	compose := func(d time.Duration, args ...string) string {
		t.Helper()
		return mustRun(t, d, env, "docker-compose", append([]string{"-p", project, "-f", filepath.Join(deploy, "compose.yaml")}, args...)...)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command("docker-compose", "-p", project, "-f", filepath.Join(deploy, "compose.yaml"), "logs", "--no-color", "--tail", "40").CombinedOutput()
			t.Logf("container logs:\n%s", out)
		}
		c := exec.Command("docker-compose", "-p", project, "-f", filepath.Join(deploy, "compose.yaml"), "down", "-v", "-t", "5")
		c.Env = append(os.Environ(), env...)
		c.Run()
	})
	compose(3*time.Minute, "up", "-d")

	// health runs `grove health` inside node-1's container.
	health := func() (string, int) {
		c := exec.Command("docker-compose", "-p", project, "-f", filepath.Join(deploy, "compose.yaml"),
			"exec", "-T", "node-1", "/grove", "health", "--endpoints", "172.28.233.11:7410,172.28.233.12:7410", "--command-timeout", "5s")
		c.Env = append(os.Environ(), env...)
		var out bytes.Buffer
		c.Stdout, c.Stderr = &out, &out
		err := c.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			code = -1
		}
		return out.String(), code
	}
	waitHealth := func(what string, ok func(out string, code int) bool) string {
		t.Helper()
		var out string
		var code int
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			out, code = health()
			if ok(out, code) {
				return out
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: last grove health (exit %d): %s", what, code, out)
			}
		}
	}
	out := waitHealth("cluster healthy", func(_ string, code int) bool { return code == 0 })
	t.Logf("compose cluster: %s", strings.TrimSpace(out))
	compose(time.Minute, "kill", "node-3")
	out = waitHealth("node 3 reported dead", func(out string, code int) bool { return code == 6 && strings.Contains(out, "node 3 is dead") })
	t.Logf("after kill: %s", strings.TrimSpace(out))
	compose(time.Minute, "start", "node-3")
	out = waitHealth("node 3 alive again", func(_ string, code int) bool { return code == 0 })
	t.Logf("after start: %s", strings.TrimSpace(out))
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// mustRun runs a command, failing the test if it fails or takes longer than d.
func mustRun(t *testing.T, d time.Duration, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c := exec.CommandContext(ctx, name, args...)
	c.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}
