package ratelog

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestLimiterPassesOncePerIntervalAndCounts(t *testing.T) {
	l := New(50 * time.Millisecond)
	if ok, n := l.Allow("a"); !ok || n != 0 {
		t.Fatalf("first line held back: %v %d", ok, n)
	}
	for i := 0; i < 5; i++ {
		if ok, _ := l.Allow("a"); ok {
			t.Fatal("a repeat within the interval passed")
		}
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("another key was held back")
	}
	time.Sleep(60 * time.Millisecond)
	if ok, n := l.Allow("a"); !ok || n != 5 {
		t.Fatalf("after the interval: %v, %d suppressed (want 5)", ok, n)
	}
	for i := 0; i < 3*MaxKeys; i++ {
		l.Allow(strings.Repeat("k", i%50) + string(rune(i)))
	}
	if len(l.seen) > MaxKeys {
		t.Fatalf("%d keys remembered > %d", len(l.seen), MaxKeys)
	}
}

func TestWriterKeysIgnoreTimestampsAndValues(t *testing.T) {
	var out bytes.Buffer
	var keys []string
	w := Writer(&out, New(time.Hour), func(k string) { keys = append(keys, k) })
	w.Write([]byte("2026-11-22T10:00:00.000Z [ERROR] raft-1: failed to decode incoming command: error=\"unknown rpc type 71\"\n"))
	w.Write([]byte("2026-11-22T10:00:01.000Z [ERROR] raft-1: failed to decode incoming command: error=\"EOF\"\n" +
		"2026-11-22T10:00:01.000Z [WARN]  raft-1: heartbeat timeout reached: last-leader-addr=x\n"))
	if got := strings.Count(out.String(), "\n"); got != 2 {
		t.Fatalf("wrote %d lines, want 2 (the repeat suppressed):\n%s", got, out.String())
	}
	if len(keys) != 3 || keys[0] != keys[1] || keys[0] != "raft-1: failed to decode incoming command: error" {
		t.Fatalf("keys: %q", keys)
	}
}
