package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The JSON of a Doc has exactly the table's headers as keys, lists are
// never null, and the table text differs from JSON values only where a
// cell says so.
func TestDocJSONKeysAreHeaders(t *testing.T) {
	d := &Doc{}
	d.Field("healthy", true)
	d.FieldText("leader", uint64(0), "none")
	tb := d.Table("nodes", "NODE", "HEARD-BY", "ROLES")
	tb.Row(uint64(1), C("3/3", 3), []string{"meta", "lock"})
	tb.Row(uint64(2), C("1/3", 1), []string{})
	d.Table("empty", "A")
	var js bytes.Buffer
	if err := d.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, js.String())
	}
	if got["healthy"] != true || got["leader"] != float64(0) {
		t.Fatalf("fields: %v", got)
	}
	if e, ok := got["empty"].([]any); !ok || len(e) != 0 {
		t.Fatalf("empty table is %v, want []", got["empty"])
	}
	rows := got["nodes"].([]any)
	r0 := rows[0].(map[string]any)
	if len(r0) != 3 || r0["node"] != float64(1) || r0["heard_by"] != float64(3) {
		t.Fatalf("row 0: %v", r0)
	}
	if roles := rows[1].(map[string]any)["roles"]; roles == nil {
		t.Fatalf("empty list printed as null")
	}
	var tab bytes.Buffer
	if err := d.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"healthy: true", "leader: none", "NODE  HEARD-BY  ROLES", "3/3", "meta,lock"} {
		if !strings.Contains(tab.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, tab.String())
		}
	}
}

func TestOutputFlag(t *testing.T) {
	for _, c := range []struct {
		format string
		json   bool
		ok     bool
	}{{"table", false, true}, {"json", false, true}, {"table", true, true}, {"yaml", false, false}, {"yaml", true, false}} {
		o := Output{Format: c.format, json: c.json}
		err := o.Resolve()
		if (err == nil) != c.ok {
			t.Errorf("%+v: %v", c, err)
		}
		if err != nil && Code(err) != ExitUsage {
			t.Errorf("%+v: exit %d, want %d", c, Code(err), ExitUsage)
		}
	}
}

func TestCodes(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errors.New("x"), ExitFailed},
		{Usagef("bad"), ExitUsage},
		{ExitStatus(42), 42},
		{Interrupted{Signal: "interrupt"}, ExitInterrupted},
		{Interrupted{Signal: "terminated"}, 143},
		{FromRPC("op", "e", time.Second, status.Error(codes.Unavailable, "no quorum")), ExitUnavailable},
		{FromRPC("op", "e", time.Second, status.Error(codes.DeadlineExceeded, "")), ExitTimeout},
		{FromRPC("op", "e", time.Second, context.DeadlineExceeded), ExitTimeout},
		{FromRPC("op", "e", time.Second, status.Error(codes.NotFound, "no such lock")), ExitNotFound},
		{FromRPC("op", "e", time.Second, status.Error(codes.InvalidArgument, "bad name")), ExitUsage},
	} {
		if got := Code(c.err); got != c.want {
			t.Errorf("Code(%v) = %d, want %d", c.err, got, c.want)
		}
	}
	e := FromRPC("status", "127.0.0.1:1", time.Second, status.Error(codes.Unavailable, "no quorum"))
	if !strings.HasPrefix(e.Error(), "status: 127.0.0.1:1 ") || strings.Contains(e.Error(), "rpc error") {
		t.Fatalf("message %q: want the operation and endpoint, no raw gRPC status", e)
	}
}

func TestResolveEndpoints(t *testing.T) {
	t.Setenv(EndpointsEnv, "")
	c := Client{DialTimeout: time.Second}
	if err := c.Resolve(); err != nil || len(c.Endpoints) != 1 || c.Endpoints[0] != DefaultEndpoint {
		t.Fatalf("default: %v %v", c.Endpoints, err)
	}
	t.Setenv(EndpointsEnv, "127.0.0.1:1, 127.0.0.1:2")
	c = Client{DialTimeout: time.Second}
	if err := c.Resolve(); err != nil || len(c.Endpoints) != 2 || c.Endpoints[1] != "127.0.0.1:2" {
		t.Fatalf("env: %v %v", c.Endpoints, err)
	}
	c = Client{DialTimeout: time.Second, addr: "127.0.0.1:3"}
	if err := c.Resolve(); err != nil || c.Endpoints[0] != "127.0.0.1:3" {
		t.Fatalf("--addr over env: %v %v", c.Endpoints, err)
	}
	for _, bad := range []Client{
		{DialTimeout: time.Second, addr: "127.0.0.1"},
		{DialTimeout: time.Second, addr: "127.0.0.1:70000"},
		{DialTimeout: time.Second, addr: "x:1", endpoints: []string{"y:2"}},
		{DialTimeout: 0, addr: "x:1"},
		{DialTimeout: time.Second, CommandTimeout: -1, addr: "x:1"},
	} {
		if err := bad.Resolve(); Code(err) != ExitUsage {
			t.Errorf("%+v: %v, want a usage error", bad, err)
		}
	}
}

// A closed port fails at once as "refused"; a listener that accepts and
// never answers fails after --dial-timeout, not later.
func TestConnectFailures(t *testing.T) {
	// A socket bound and never listening refuses connections, and keeps
	// its port from the next listener (a listener closed at once would
	// free it: the silent one below could get it).
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	closed := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close() // hold it open, say nothing
		}
	}()
	c := Client{DialTimeout: 400 * time.Millisecond}
	start := time.Now()
	_, err = c.Connect(context.Background(), closed)
	if Code(err) != ExitUnavailable || !strings.Contains(err.Error(), "refused the connection") || time.Since(start) > 300*time.Millisecond {
		t.Fatalf("closed port: %v after %v", err, time.Since(start))
	}
	start = time.Now()
	_, err = c.Connect(context.Background(), silent.Addr().String())
	if el := time.Since(start); Code(err) != ExitTimeout || !strings.Contains(err.Error(), "did not answer") || el > 2*time.Second {
		t.Fatalf("silent listener: %v after %v", err, el)
	}
	c.endpoints = []string{closed, silent.Addr().String()}
	err = c.Do(context.Background(), "status", func(context.Context, *Conn) error { return nil })
	if msg := err.Error(); !strings.HasPrefix(msg, "status: ") || !strings.Contains(msg, closed) || !strings.Contains(msg, silent.Addr().String()) {
		t.Fatalf("two endpoints: %v", err)
	}
}
