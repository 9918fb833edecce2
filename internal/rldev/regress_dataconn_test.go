package rldev

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// From an outside review of the data path: a clerk's write whose attempt
// ended (its context) before the connection took its frame left the frame
// queued on the connection's writer, pointing at the caller's buffer. The
// caller, told the write failed, reused the buffer; the queued frame then
// carried the new contents to the node, which wrote them at the old
// offset. Now the connection ends with the frame before Write returns: the
// node gets the original data or nothing. (net.Pipe stands for a node
// whose reader has stopped reading.)
func TestRegressDataPathWriteBufferRetained(t *testing.T) {
	node, clerk := net.Pipe()
	defer node.Close()
	d := &dataConn{addr: "pipe", w: newFrameWriter(clerk), wait: map[uint64]*pendingCall{}}
	go d.readLoop(clerk)
	defer d.fail(net.ErrClosed)

	data := bytes.Repeat([]byte{0xaa}, BlockSize)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := d.Write(ctx, &pb.RLDevServiceWriteRequest{Rldev: 1, Offset: 0, Data: data}); err == nil {
		t.Fatal("the write succeeded with nobody answering")
	}
	// Write returned: the caller owns its buffer again.
	for i := range data {
		data[i] = 0x55
	}
	node.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := readFrame(bufio.NewReader(node), nil, 0)
	if err != nil {
		t.Logf("the node got no whole frame (%v): the write was dropped with its connection", err)
		return
	}
	if f.typ != frameWrite || len(f.bulk) != BlockSize {
		t.Fatalf("frame type %d with %d bytes", f.typ, len(f.bulk))
	}
	if f.bulk[0] != 0xaa {
		t.Errorf("the node received a write of %#x..., the buffer's contents after Write returned (it was called with %#x...)", f.bulk[0], 0xaa)
	}
}

// A node that stops (SIGSTOP: its kernel still holds the connection)
// sends no pings: the clerk's connection fails its requests after
// linkIdle, as gRPC's keepalive did, instead of each waiting out its
// attempt.
func TestDataPathSilentNodeFailsRequests(t *testing.T) {
	node, clerk := net.Pipe()
	defer node.Close()
	go io.Copy(io.Discard, node) // reads everything, answers nothing
	d := &dataConn{addr: "pipe", w: newFrameWriter(clerk), wait: map[uint64]*pendingCall{}}
	go d.readLoop(clerk)
	defer d.fail(net.ErrClosed)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := d.Read(ctx, &pb.RLDevServiceReadRequest{Rldev: 1, Length: BlockSize}, nil)
	if !errors.Is(err, ErrConnLost) {
		t.Fatalf("a read from a silent node: %v after %v, want ErrConnLost", err, time.Since(start))
	}
	if el := time.Since(start); el < linkIdle-time.Second || el > linkIdle+3*time.Second {
		t.Fatalf("failed after %v, want about %v", el, linkIdle)
	}
}
