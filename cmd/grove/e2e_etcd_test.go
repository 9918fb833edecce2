package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/grovestore/grove/api/etcdpb"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/transport"
)

// etcdctl (Debian's etcd-client, etcd 3.4) against the etcd-compatible
// endpoint of real nodes: puts through one node, reads through another;
// prefixes, ranges, limits, keys-only, count-only (over gRPC: etcdctl 3.4
// lacks the flag), reverse order, deletes;
// and clear errors for what it does not have (revisions, leases, txn).
func TestEndToEndEtcdctl(t *testing.T) {
	t.Parallel() // its own ports and directories: see parallelTests
	etcdctl, err := exec.LookPath("etcdctl")
	if err != nil {
		t.Skip("etcdctl not installed (apt-get install etcd-client; scripts/test.sh does)")
	}
	_, u, ctx := startCluster(t, 8900, "--chunk-size", "64MiB")
	run := func(node uint64, args ...string) (string, string, error) {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, etcdctl, append([]string{"--endpoints=" + u.Nodes[node].GRPC, "--command-timeout=20s"}, args...)...)
		cmd.Env = append(cmd.Environ(), "ETCDCTL_API=3")
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		cmd.Stdin = strings.NewReader("\n\n\n") // an empty txn (compares, success, failure)
		err := cmd.Run()
		return out.String(), errb.String(), err
	}
	must := func(node uint64, want string, args ...string) {
		t.Helper()
		out, stderr, err := run(node, args...)
		if err != nil || out != want {
			t.Fatalf("etcdctl %v through node %d: %q (want %q), %v, %s", args, node, out, want, err, stderr)
		}
	}
	// The first put makes the endpoint's tree (the node's B-tree server
	// may still be starting: retry a little).
	for start := time.Now(); ; time.Sleep(500 * time.Millisecond) {
		out, stderr, err := run(1, "put", "app/a", "1")
		if err == nil && out == "OK\n" {
			break
		}
		if time.Since(start) > 90*time.Second {
			t.Fatalf("etcdctl put: %q %v %s", out, err, stderr)
		}
	}
	must(1, "OK\n", "put", "app/b", "2")
	must(2, "OK\n", "put", "app/c", "3")
	must(2, "OK\n", "put", "other", "x")
	must(3, "app/a\n1\n", "get", "app/a")
	must(3, "1\n", "get", "app/a", "--print-value-only")
	must(1, "", "get", "app/zzz")
	must(3, "app/a\n1\napp/b\n2\napp/c\n3\n", "get", "app/", "--prefix")
	must(3, "app/a\n\napp/b\n\n", "get", "app/", "--prefix", "--keys-only", "--limit=2") // (etcdctl prints an empty value line, as with etcd)
	must(2, "app/b\n2\n", "get", "app/b", "app/c")                                       // [app/b, app/c)
	must(2, "app/c\n3\napp/b\n2\napp/a\n1\n", "get", "app/", "--prefix", "--order=DESCEND", "--sort-by=KEY")
	must(1, "app/b\n2\napp/c\n3\nother\nx\n", "get", "app/b", "--from-key")
	// etcdctl 3.4 has no --count-only (3.5's does): the same request over
	// gRPC, as etcd's clients send it.
	cc, err := grpc.NewClient(u.Nodes[1].GRPC, transport.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if r, err := etcdpb.NewKVClient(cc).Range(ctx, &etcdpb.RangeRequest{Key: []byte("app/"), RangeEnd: []byte("app0"), CountOnly: true}); err != nil || r.Count != 3 || len(r.Kvs) != 0 {
		t.Fatalf("count-only: %v %v", r, err)
	}
	if out, _, err := run(1, "get", "app/", "--prefix", "--limit=1", "-w", "fields"); err != nil || !strings.Contains(out, `"Count" : 3`) || !strings.Contains(out, `"More" : true`) {
		t.Fatalf("a limited range's count and more: %q %v", out, err)
	}
	must(1, "OK\napp/a\n1\n", "put", "app/a", "10", "--prev-kv")
	// A 64 KiB value (in a chunk of its own), overwritten with --prev-kv,
	// read through another node, deleted.
	big, big2 := strings.Repeat("0123456789abcdef", 4<<10), strings.Repeat("fedcba9876543210", 4<<10)
	must(2, "OK\n", "put", "big", big)
	must(1, "OK\nbig\n"+big+"\n", "put", "big", big2, "--prev-kv")
	must(3, big2+"\n", "get", "big", "--print-value-only")
	must(3, "1\n", "del", "big")
	must(3, "1\n", "del", "app/b")
	must(3, "0\n", "del", "app/b")
	must(2, "2\n", "del", "app/", "--prefix")
	must(1, "other\nx\n", "get", "", "--from-key")

	// What the endpoint does not have answers clearly.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"get", "other", "--rev=1"}, "no MVCC history"},
		{[]string{"put", "k", "v", "--lease=1234"}, "no leases"},
		{[]string{"txn"}, "no transactions"},
		{[]string{"compaction", "1"}, "no MVCC history"},
		{[]string{"put", "", "v"}, "key is not provided"},
		{[]string{"put", strings.Repeat("k", 2000), "v"}, "key"},
	} {
		_, stderr, err := run(1, c.args...)
		if err == nil || !strings.Contains(stderr, c.want) {
			t.Fatalf("etcdctl %v: %v, stderr %q (want it to say %q)", c.args, err, stderr, c.want)
		}
	}
	// The tree is an ordinary one: grove tree sees the same keys.
	if r := grove(t, buildGrove(t), nil, "tree", "get", "etcd", "other", "--endpoints="+u.Nodes[2].GRPC); r.code != 0 || r.stdout != "x\n" {
		t.Fatalf("grove tree get: %v", r)
	}

	// The nodes forward every call to the tree's home node. SIGKILL it: the
	// others serve the calls themselves once their connection to it is
	// down (after the dead server's replay), and nothing acknowledged is
	// lost.
	home := btree.Home("etcd", []uint64{1, 2, 3})
	other := home%3 + 1
	must(other, "OK\n", "put", "before-kill", "1")
	if err := u.Kill(home); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for {
		out, stderr, err := run(other, "put", "after-kill", "2")
		if err == nil && out == "OK\n" {
			break
		}
		if time.Since(killed) > 90*time.Second {
			t.Fatalf("put through node %d after its home node %d died: %q %v %s", other, home, out, err, stderr)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("node %d (the tree's home) killed; node %d served a put %v later", home, other, time.Since(killed).Round(time.Millisecond))
	must(other, "before-kill\n1\n", "get", "before-kill")
	must(other%3+1, "after-kill\n2\n", "get", "after-kill")
}
