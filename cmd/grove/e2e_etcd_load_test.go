package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grovestore/grove/api/etcdpb"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/transport"
)

// TestEndToEndEtcdForwardSIGKILL: etcd puts through the two nodes that are
// not the tree's home, each forwarded to the home over its stream, eight
// at a time; the home is SIGKILLed mid-load. Every put acknowledged before
// or after reads back through both survivors (the home's log is replayed
// by another server, and the nodes serve the calls themselves once the
// home is gone); a put whose answer was lost with the home fails (Unknown:
// it may have been applied) rather than being served again by the node;
// and no key holds anything but its own value.
func TestEndToEndEtcdForwardSIGKILL(t *testing.T) {
	_, u, ctx := startCluster(t, 7700, "--chunk-size", "64MiB")
	keepLogsOnFailure(t, u, "grove-e2e-etcd-forward")
	home := btree.Home("etcd", []uint64{1, 2, 3})
	var others []uint64
	for id := uint64(1); id <= 3; id++ {
		if id != home {
			others = append(others, id)
		}
	}
	kv := func(id uint64) etcdpb.KVClient {
		cc, err := grpc.NewClient(u.Nodes[id].GRPC, transport.DialOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return etcdpb.NewKVClient(cc)
	}
	clients := map[uint64]etcdpb.KVClient{others[0]: kv(others[0]), others[1]: kv(others[1])}
	for start := time.Now(); ; time.Sleep(300 * time.Millisecond) { // the tree is made at the first call
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := clients[others[0]].Put(cctx, &etcdpb.PutRequest{Key: []byte("warm"), Value: []byte("x")})
		cancel()
		if err == nil {
			break
		}
		if time.Since(start) > 90*time.Second {
			t.Fatalf("first put: %v", err)
		}
	}
	var mu sync.Mutex
	acked := map[string]string{}
	lost := map[codes.Code]int{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := clients[others[w%2]]
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d-%05d", w, i), fmt.Sprintf("v%d.%d", w, i)
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				_, err := c.Put(cctx, &etcdpb.PutRequest{Key: []byte(k), Value: []byte(v)})
				cancel()
				mu.Lock()
				if err == nil {
					acked[k] = v
				} else {
					lost[status.Code(err)]++
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}(w)
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	waitFor := func(n int) {
		t.Helper()
		for start := time.Now(); count() < n; time.Sleep(50 * time.Millisecond) {
			if time.Since(start) > 90*time.Second {
				t.Fatalf("only %d puts acknowledged (want %d); failures by code %v", count(), n, lost)
			}
		}
	}
	waitFor(400)
	if err := u.Kill(home); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	before := count()
	waitFor(before + 300)
	close(stop)
	wg.Wait()
	t.Logf("%d puts acknowledged (%d before node %d, the home, was SIGKILLed; %d more within %v); failed puts by code: %v",
		len(acked), before, home, len(acked)-before, time.Since(killed).Round(time.Millisecond), lost)
	// Every acknowledged put, through both survivors.
	for _, id := range others {
		c := clients[id]
		for k, v := range acked {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			r, err := c.Range(cctx, &etcdpb.RangeRequest{Key: []byte(k)})
			cancel()
			if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != v {
				t.Fatalf("acknowledged %s=%s; through node %d: %v %v", k, v, id, r, err)
			}
		}
	}
	// No key holds a value but its own (a put applied twice, or a value
	// from another put, would show here), and nothing is there that was
	// never put: every key present is w*-* with its own value.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := clients[others[1]].Range(cctx, &etcdpb.RangeRequest{Key: []byte("w0"), RangeEnd: []byte("w:")})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range r.Kvs {
		var w, i int
		if _, err := fmt.Sscanf(string(e.Key), "w%d-%05d", &w, &i); err != nil || string(e.Value) != fmt.Sprintf("v%d.%d", w, i) {
			t.Fatalf("key %q holds %q", e.Key, e.Value)
		}
	}
	if len(r.Kvs) < len(acked) {
		t.Fatalf("the range holds %d keys, %d were acknowledged", len(r.Kvs), len(acked))
	}
}
