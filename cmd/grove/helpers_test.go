package main

import (
	"encoding/json"
	"strings"
	"testing"
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
