package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/grovestore/grove/internal/bench"
)

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func parseStatus(t *testing.T, b []byte) StatusJSON {
	t.Helper()
	var s StatusJSON
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("status --json does not parse: %v\n%s", err, b)
	}
	return s
}

// startCluster builds grove and runs `grove up --processes` on base port
// port for a real-process test; it is stopped when the test ends.
func startCluster(t *testing.T, port int) (string, *bench.UpCluster, context.Context) {
	t.Helper()
	if testing.Short() {
		t.Skip("real processes")
	}
	bin := buildGrove(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	u, err := bench.StartUp(ctx, bin, t.TempDir(), port, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.Close)
	return bin, u, ctx
}
