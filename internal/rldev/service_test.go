package rldev_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/bench"
	"github.com/grovestore/grove/internal/disk"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/rldev"
)

// waitNormal waits until every RLDev is normal with both segments joined
// by their nodes' running incarnations.
func waitNormal(t *testing.T, ctx context.Context, cl *rldev.Clerk, want int) *rldev.Table {
	t.Helper()
	var last string
	for ctx.Err() == nil {
		tb, err := cl.Table(ctx, true)
		if err == nil && len(tb.RLDevs) >= want {
			ok := true
			for _, r := range tb.RLDevs {
				if r.State != rldev.Normal || r.Inc[0] == 0 || r.Inc[1] == 0 {
					ok = false
					last = fmt.Sprintf("rldev %d: %v, stale %v, incarnations %v", r.ID, r.State, r.Stale, r.Inc)
				}
			}
			if ok {
				return tb
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("RLDevs not normal: %s", last)
	return nil
}

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// The runtime end to end, in one process: three store nodes, three RLDevs
// (chained: each node primary of one, secondary of another), writes and
// reads through the clerk; a node stops, writes go on in degraded mode; it
// comes back, is resynced, and both copies are equal.
// Blocks travel on the framed data path (the default) or on gRPC: both
// are run; and the framed path once more with the nodes' small writes
// past the page cache ([rldev] direct_writes).
func TestServiceDegradedAndResync(t *testing.T) {
	for _, path := range []string{rldev.DataPathTCP, rldev.DataPathGRPC} {
		t.Run(path, func(t *testing.T) { testServiceDegradedAndResync(t, path, false) })
	}
	t.Run("tcp+direct", func(t *testing.T) { testServiceDegradedAndResync(t, rldev.DataPathTCP, true) })
}

func testServiceDegradedAndResync(t *testing.T, path string, direct bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 3, bench.ClusterOptions{Store: true, DiskSize: 128 << 20, Log: testLog(t), DataPath: path, DirectWrites: direct})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The option reaches the disks where the file system takes direct
	// writes, and only with it on.
	wantDirect := direct && directWritesHere(t)
	for _, n := range c.Nodes {
		if d, all := n.DirectDisks(); all == 0 || wantDirect && d != all || !wantDirect && d != 0 {
			t.Fatalf("node %d: %d of its %d disks take direct writes (direct_writes %v, the file system allows them: %v)", n.ID(), d, all, direct, wantDirect)
		}
	}
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	cl := rldev.NewClerkWith(mc, rldev.ClerkOptions{DataPath: path})
	defer cl.Close()
	var recs []*rldev.Record
	for ctx.Err() == nil { // the nodes register their disks first
		if recs, err = cl.Create(ctx, 8<<20, 3, false); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	waitNormal(t, ctx, cl, 3)
	want := map[uint64][]byte{}
	for _, r := range recs {
		want[r.ID] = make([]byte, 8<<20)
	}
	write := func(id, off uint64, n int) {
		t.Helper()
		d := random(n)
		if err := cl.Write(ctx, id, off, d, rldev.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		copy(want[id][off:], d)
	}
	check := func(replica int) {
		t.Helper()
		for id, w := range want {
			got, err := cl.Read(ctx, id, 0, uint64(len(w)), replica)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, w) {
				t.Fatalf("rldev %d (replica %d): the data read back differs", id, replica)
			}
		}
	}
	for _, r := range recs {
		write(r.ID, 0, 1<<20)
		write(r.ID, 4<<20, 64<<10)
	}
	check(0)
	check(1)
	check(2)

	// Node 2 stops: the RLDevs it holds go degraded; writes go on.
	c.Stop(1)
	for _, r := range recs {
		write(r.ID, 1<<20, 256<<10)
		write(r.ID, 7<<20, 4096)
	}
	check(0)
	if err := c.Start(1); err != nil {
		t.Fatal(err)
	}
	waitNormal(t, ctx, cl, 3)
	check(1)
	check(2)
}

// testLog is the nodes' log: into the test's output with -v and
// GROVE_LOG=1, else nowhere.
func testLog(t *testing.T) *slog.Logger {
	if os.Getenv("GROVE_LOG") == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// BenchmarkServiceWrite4K: replicated 4 KiB writes at queue depth 1
// through the clerk, two store nodes in this process (loopback gRPC, the
// disks in files): the whole data path's cost per write.
func BenchmarkServiceWrite4K(b *testing.B) { benchService(b, true, 4096, 1) }

// BenchmarkServiceWrite4KQD32: replicated 4 KiB random writes, 32 at once.
func BenchmarkServiceWrite4KQD32(b *testing.B) { benchService(b, true, 4096, 32) }

// BenchmarkServiceRead4K: 4 KiB reads at queue depth 1.
func BenchmarkServiceRead4K(b *testing.B) { benchService(b, false, 4096, 1) }

// The benchmarks run on the framed data path, or on gRPC with
// GROVE_DATA_PATH=grpc; with GROVE_DIRECT_WRITES=1 the nodes write small
// blocks past the page cache ([rldev] direct_writes); the garbage
// collector as in a node's process.
func benchService(b *testing.B, write bool, size, qd int) {
	ctx := context.Background()
	if os.Getenv("GOGC") == "" {
		defer debug.SetGCPercent(debug.SetGCPercent(400))
	}
	path := os.Getenv("GROVE_DATA_PATH")
	c, err := bench.StartCluster(b.TempDir(), 2, bench.ClusterOptions{Store: true, DiskSize: 256 << 20, DataPath: path, DirectWrites: os.Getenv("GROVE_DIRECT_WRITES") != ""})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	cl := rldev.NewClerkWith(mc, rldev.ClerkOptions{DataPath: path})
	defer cl.Close()
	id := createServed(b, ctx, cl, 64<<20)
	data := random(size)
	// Written whole first, as a file system's blocks are: the first write
	// of a block of a sparse disk file costs the file system an
	// allocation, and its sync a journal commit.
	for off := uint64(0); off < 64<<20; off += 1 << 20 {
		if err := cl.Write(ctx, id, off, make([]byte, 1<<20), rldev.WriteOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, qd)
	for j := 0; j < qd; j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, size) // used again, as fio's is
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				off := uint64(i*7919) * uint64(size) % (64 << 20)
				var err error
				if write {
					err = cl.Write(ctx, id, off, data, rldev.WriteOptions{})
				} else {
					err = cl.ReadInto(ctx, id, off, buf, 0)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkServiceWrite1M: 1 MiB replicated writes at queue depth 1.
func BenchmarkServiceWrite1M(b *testing.B) { benchService(b, true, 1<<20, 1) }

// BenchmarkServiceRead1M: 1 MiB reads at queue depth 1.
func BenchmarkServiceRead1M(b *testing.B) { benchService(b, false, 1<<20, 1) }

// dataFrame builds a frame of the data path by hand (frames.go's layout),
// as a client of another implementation would.
func dataFrame(typ byte, id uint64, meta proto.Message, bulk []byte) []byte {
	var m []byte
	if meta != nil {
		m, _ = proto.Marshal(meta)
	}
	b := binary.BigEndian.AppendUint32(nil, uint32(1+8+4+len(m)+len(bulk)))
	b = append(b, typ)
	b = binary.BigEndian.AppendUint64(b, id)
	b = binary.BigEndian.AppendUint32(b, uint32(len(m)))
	return append(append(b, m...), bulk...)
}

// Bad input on the data path: a wrong version, an unknown frame type and
// a length past the limit close the connection; a well-formed request
// that is wrong (unaligned, an unknown RLDev, a read with too much data)
// gets its error in a reply; none of it disturbs the node, which serves
// the clerk afterwards as before.
func TestDataPathBadInput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 2, bench.ClusterOptions{Store: true, DiskSize: 64 << 20, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	cl := rldev.NewClerk(mc)
	defer cl.Close()
	var recs []*rldev.Record
	for ctx.Err() == nil {
		if recs, err = cl.Create(ctx, 4<<20, 1, false); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	waitNormal(t, ctx, cl, 1)
	id := recs[0].ID
	addr := c.Configs[recs[0].Segs[recs[0].Primary].Node-1].GRPCAddr
	dial := func(pre string) net.Conn {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		conn.Write([]byte(pre))
		return conn
	}
	closed := func(what string, conn net.Conn) {
		t.Helper()
		defer conn.Close()
		if n, err := io.Copy(io.Discard, conn); err != nil || n != 0 {
			t.Fatalf("%s: the node answered %d bytes (%v); want the connection closed", what, n, err)
		}
	}
	closed("version 9", dial("GRVD\x09\x01"))
	closed("kind 7", dial("GRVD\x01\x07"))
	conn := dial("GRVD\x01\x01")
	conn.Write(dataFrame(99, 1, &pb.RLDevServiceReadRequest{}, nil))
	closed("frame type 99", conn)
	conn = dial("GRVD\x01\x01")
	conn.Write(binary.BigEndian.AppendUint32(nil, 1<<30))
	conn.Write(make([]byte, 13))
	closed("a 1 GiB frame", conn)

	conn = dial("GRVD\x01\x01")
	defer conn.Close()
	br := bufio.NewReader(conn)
	ask := func(what string, f []byte, wantType byte, want error) {
		t.Helper()
		conn.Write(f)
		h := make([]byte, 17)
		if _, err := io.ReadFull(br, h); err != nil {
			t.Fatalf("%s: no reply: %v", what, err)
		}
		body := make([]byte, binary.BigEndian.Uint32(h)-13)
		if _, err := io.ReadFull(br, body); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		m := body[:binary.BigEndian.Uint32(h[13:])]
		var res *pb.RLDevResult
		switch h[4] {
		case 5:
			var r pb.RLDevServiceReadResponse
			proto.Unmarshal(m, &r)
			res = r.Result
		case 6:
			var r pb.RLDevServiceWriteResponse
			proto.Unmarshal(m, &r)
			res = r.Result
		}
		if h[4] != wantType || binary.BigEndian.Uint64(h[5:]) != 77 {
			t.Fatalf("%s: reply type %d id %d", what, h[4], binary.BigEndian.Uint64(h[5:]))
		}
		if err := rldev.ResultError(res); !errors.Is(err, want) {
			t.Fatalf("%s: %v, want %v", what, err, want)
		}
		t.Logf("%s: %v", what, rldev.ResultError(res))
	}
	ask("an unaligned read", dataFrame(3, 77, &pb.RLDevServiceReadRequest{Rldev: id, Offset: 100, Length: 4096}, nil), 5, rldev.ErrBadRequest)
	ask("an empty write", dataFrame(4, 77, &pb.RLDevServiceWriteRequest{Rldev: id}, nil), 6, rldev.ErrBadRequest)
	ask("a write past the end", dataFrame(4, 77, &pb.RLDevServiceWriteRequest{Rldev: id, Offset: 4 << 20}, make([]byte, 4096)), 6, rldev.ErrBadRequest)
	ask("an unknown rldev", dataFrame(3, 77, &pb.RLDevServiceReadRequest{Rldev: 999, Length: 4096}, nil), 5, rldev.ErrUnknown)
	ask("a good read", dataFrame(3, 77, &pb.RLDevServiceReadRequest{Rldev: id, Length: 4096}, nil), 5, nil)

	d := random(64 << 10)
	if err := cl.Write(ctx, id, 8192, d, rldev.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	for replica := 1; replica <= 2; replica++ {
		got, err := cl.Read(ctx, id, 8192, uint64(len(d)), replica)
		if err != nil || !bytes.Equal(got, d) {
			t.Fatalf("replica %d after the bad input: %v", replica, err)
		}
	}
}

// A data-path connection's bounds: with its peer stopped, a primary's
// writes wait (for the failure detector's verdict); a clerk that pipelines
// more than a connection's limit (256) gets the extra ones refused at once
// as busy, its reader never stops; cancel frames free the slots, and a
// request after them is taken (and completes once the RLDev degrades).
func TestDataPathBusyAndCancel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 2, bench.ClusterOptions{Store: true, DiskSize: 64 << 20, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	cl := rldev.NewClerk(mc)
	defer cl.Close()
	var recs []*rldev.Record
	for ctx.Err() == nil {
		if recs, err = cl.Create(ctx, 4<<20, 1, false); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	waitNormal(t, ctx, cl, 1)
	rec := recs[0]
	prim, sec := rec.Segs[rec.Primary].Node, rec.Segs[1-rec.Primary].Node
	if sec == 1 {
		t.Skip("the secondary is the config-service member: stopping it would stop the cluster")
	}
	c.Stop(int(sec - 1))
	conn, err := net.Dial("tcp", c.Configs[prim-1].GRPCAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("GRVD\x01\x01"))
	const n = 256 + 10
	var out []byte
	for i := uint64(1); i <= n; i++ {
		out = append(out, dataFrame(4, i, &pb.RLDevServiceWriteRequest{Rldev: rec.ID, Offset: (i % 1024) * 4096}, random(4096))...)
	}
	conn.Write(out)
	br := bufio.NewReader(conn)
	reply := func(deadline time.Duration) (uint64, error, bool) {
		conn.SetReadDeadline(time.Now().Add(deadline))
		for {
			h := make([]byte, 17)
			if _, err := io.ReadFull(br, h); err != nil {
				return 0, nil, false
			}
			body := make([]byte, binary.BigEndian.Uint32(h)-13)
			if _, err := io.ReadFull(br, body); err != nil {
				return 0, nil, false
			}
			if h[4] == 7 { // a ping
				continue
			}
			var r pb.RLDevServiceWriteResponse
			proto.Unmarshal(body[:binary.BigEndian.Uint32(h[13:])], &r)
			return binary.BigEndian.Uint64(h[5:]), rldev.ResultError(r.Result), true
		}
	}
	busy := 0
	for {
		id, err, ok := reply(500 * time.Millisecond)
		if !ok {
			break
		}
		if err != nil && strings.Contains(err.Error(), "requests in progress") {
			busy++
			if id <= 256 {
				t.Fatalf("write %d refused as busy: the first 256 fit", id)
			}
		}
	}
	if busy == 0 {
		t.Fatal("no write refused as busy")
	}
	t.Logf("%d writes refused as busy", busy)
	var cancels []byte
	for i := uint64(1); i <= 256; i++ {
		cancels = append(cancels, dataFrame(8, i, nil, nil)...)
	}
	conn.Write(cancels)
	conn.Write(dataFrame(4, 1000, &pb.RLDevServiceWriteRequest{Rldev: rec.ID, Offset: 0}, random(4096)))
	for {
		id, err, ok := reply(20 * time.Second)
		if !ok {
			t.Fatal("no answer to the write after the cancels")
		}
		if id != 1000 {
			continue // one that ended before its cancel arrived
		}
		if err != nil {
			t.Fatalf("the write after the cancels: %v", err)
		}
		break
	}
}

// TestWriteReportMaybeWrittenByIncarnation: every answer names the engine
// incarnation that gave it, on both data paths; a write answered "maybe
// written" by one incarnation of a node (as a node answers the writes it
// had in progress when it fences itself) and then answered by that node
// again reports that the first attempt may land later only if the same
// incarnation (or one that names none: an earlier build) answered both.
// A node's next engine starts once every disk operation of the one
// before has landed (Service.generation.ops), so a later incarnation's
// answer comes after anything the earlier one could still write.
func TestWriteReportMaybeWrittenByIncarnation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 2, bench.ClusterOptions{Store: true, DiskSize: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	plain := rldev.NewClerk(mc)
	defer plain.Close()
	id := createServed(t, ctx, plain, 16<<20)
	tb, err := plain.Table(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	rec := tb.RLDevs[id]
	primaryInc := rec.Inc[rec.Primary]
	for _, path := range []string{rldev.DataPathTCP, rldev.DataPathGRPC} {
		same := func(r uint64) uint64 { return r }
		for _, tc := range []struct {
			name         string
			first, later func(uint64) uint64
			earlier      bool
		}{
			{"the same incarnation", same, same, true},
			{"an earlier incarnation", same, func(r uint64) uint64 { return r + 1 }, false},
			{"no incarnation named", func(uint64) uint64 { return 0 }, same, true},
			{"an incarnation, then none (an earlier build)", same, func(uint64) uint64 { return 0 }, true},
		} {
			cl := rldev.NewClerkWith(mc, rldev.ClerkOptions{DataPath: path})
			var seen []uint64
			var mu sync.Mutex
			rldev.AnswerFirstWriteMaybe(cl, tc.first, tc.later, func(inc uint64) { mu.Lock(); seen = append(seen, inc); mu.Unlock() })
			data := random(4096)
			earlier, err := cl.WriteReport(ctx, id, 0, data, rldev.WriteOptions{})
			cl.Close()
			if err != nil || earlier != tc.earlier {
				t.Fatalf("%s, maybe written by %s: earlier %v, %v (want %v, nil)", path, tc.name, earlier, err, tc.earlier)
			}
			mu.Lock()
			for _, inc := range seen {
				if inc != primaryInc {
					t.Fatalf("%s: an answer names incarnation %d; the primary runs %d", path, inc, primaryInc)
				}
			}
			if len(seen) != 2 {
				t.Fatalf("%s: %d answers seen, want 2", path, len(seen))
			}
			mu.Unlock()
		}
	}
}

// TestWriteReportEarlierAttempt: a write whose first attempt reached the
// RLDev and lost its answer, retried at the same node and answered,
// reports that an earlier attempt may still land on the gRPC data path
// (the chunk store passes it on, and the B-tree server then renews its
// fence and writes again), and not on the framed one, whose connections
// the node sequences (admitClerkConn: the lost attempt started before the
// retry, or never starts), and on both that it was applied once (the
// retry found the first attempt landed: WriteResult.Applied); a write
// answered at once reports none and once; one
// whose every answer is lost fails with ErrMaybeWritten on both.
func TestWriteReportEarlierAttempt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := bench.StartCluster(t.TempDir(), 2, bench.ClusterOptions{Store: true, DiskSize: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mc := meta.NewClient(c.Members())
	defer mc.Close()
	var id uint64
	for i, path := range []string{rldev.DataPathGRPC, rldev.DataPathTCP} {
		cl := rldev.NewClerkWith(mc, rldev.ClerkOptions{DataPath: path})
		defer cl.Close()
		rldev.LoseWriteAnswers(cl, 1)
		if i == 0 {
			id = createServed(t, ctx, cl, 16<<20)
		}
		data := random(4096)
		info, err := cl.WriteInfo(ctx, id, 0, data, rldev.WriteOptions{})
		if want := path == rldev.DataPathGRPC; err != nil || info.EarlierMayLand != want || info.Applied != 1 {
			t.Fatalf("%s: a write whose first answer was lost: %+v, %v (want earlier %v, applied once: the retry found it landed, nil)", path, info, err, want)
		}
		got, err := cl.Read(ctx, id, 0, 4096, 0)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: reading it back: %v", path, err)
		}
		if info, err := cl.WriteInfo(ctx, id, 4096, data, rldev.WriteOptions{}); err != nil || info.EarlierMayLand || info.Applied != 1 {
			t.Fatalf("%s: a write answered at once: %+v, %v (want no earlier attempt, applied once, nil)", path, info, err)
		}
		lost := rldev.NewClerkWith(mc, rldev.ClerkOptions{DataPath: path})
		defer lost.Close()
		rldev.LoseWriteAnswers(lost, 1<<30)
		wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
		if _, err := lost.WriteReport(wctx, id, 8192, data, rldev.WriteOptions{}); err == nil || !errors.Is(err, rldev.ErrMaybeWritten) {
			wcancel()
			t.Fatalf("%s: a write whose every answer was lost: %v, want ErrMaybeWritten", path, err)
		}
		wcancel()
	}
}

// createServed creates an RLDev of size bytes through cl (retrying while
// the nodes register their disks) and waits until both its segments are
// served.
func createServed(tb testing.TB, ctx context.Context, cl *rldev.Clerk, size uint64) uint64 {
	tb.Helper()
	var recs []*rldev.Record
	var err error
	for i := 0; i < 100; i++ {
		if recs, err = cl.Create(ctx, size, 1, false); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		tb.Fatal(err)
	}
	id := recs[0].ID
	for ctx.Err() == nil {
		t, err := cl.Table(ctx, true)
		if err == nil && t.RLDevs[id].Inc[0] != 0 && t.RLDevs[id].Inc[1] != 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return id
}

// directWritesHere reports whether the file system under t.TempDir takes
// direct writes (disk.FileOptions.DirectWrites); the tests that turn them
// on then check they are used.
func directWritesHere(t *testing.T) bool {
	d, err := disk.OpenFileWith(filepath.Join(t.TempDir(), "probe"), 1<<20, disk.FileOptions{DirectWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if !d.Direct() {
		t.Logf("the file system under %s takes buffered writes only: direct writes not checked", t.TempDir())
	}
	return d.Direct()
}
