package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/grovestore/grove/client"
	"github.com/grovestore/grove/internal/bench"
)

// The hash tables through the public client: create, put, get, delete,
// the errors of a missing key, a missing table and a duplicate name; one
// node crashes and the table goes on with the other two.
func TestTables(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 3, bench.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var eps []string
	for _, m := range c.Members() {
		eps = append(eps, m.GRPCAddr)
	}
	cl, err := client.Dial(ctx, eps...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for { // every node registered (a table's groups are the registered nodes')
		err = cl.CreateTable(ctx, "sessions", client.TableOptions{Partitions: 4, Replicas: 3})
		if !errors.Is(err, client.ErrInvalid) || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.CreateTable(ctx, "sessions", client.TableOptions{}); !errors.Is(err, client.ErrExists) {
		t.Fatalf("a second table of the name: %v", err)
	}
	tb := cl.Table("sessions")
	for k := uint64(0); k < 50; k++ {
		if err := tb.Put(ctx, k, []byte{byte(k)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tb.Delete(ctx, 7); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Get(ctx, 7); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a deleted key: %v", err)
	}
	if _, err := cl.Table("nosuch").Get(ctx, 1); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a missing table: %v", err)
	}
	c.Crash(2)
	if err := tb.Put(ctx, 100, []byte("after")); err != nil {
		t.Fatalf("a put after a node crashed: %v", err)
	}
	for k := uint64(0); k < 50; k++ {
		v, err := tb.Get(ctx, k)
		if k == 7 {
			continue
		}
		if err != nil || len(v) != 1 || v[0] != byte(k) {
			t.Fatalf("key %d: %v %v", k, v, err)
		}
	}
	if err := cl.DropTable(ctx, "sessions"); err != nil {
		t.Fatal(err)
	}
	if err := tb.Put(ctx, 1, []byte("x")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a put to a dropped table: %v", err)
	}
}
