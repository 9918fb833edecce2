package rldev

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	pb "github.com/grovestore/grove/api/grovepb"
)

// ReadInto reads a reply's blocks from the connection straight into the
// caller's buffer. A read given up while its reply is arriving must not
// return before the reader stopped writing into that buffer: the caller
// owns it again once the call returned. Here the node sends half of a
// reply and stalls; the caller gives up; the node then sends the rest.
// Without the wait (pendingCall.filled), the rest lands in the buffer
// after the call returned.
func TestReadIntoGivenUpMidReply(t *testing.T) {
	node, clerk := net.Pipe()
	defer node.Close()
	d := &dataConn{addr: "pipe", w: newFrameWriter(clerk), wait: map[uint64]*pendingCall{}}
	go d.readLoop(clerk)
	defer d.fail(net.ErrClosed)

	nodeDone, half := make(chan error, 1), make(chan struct{})
	var restErr error // (read after nodeDone)
	go func() {
		f, err := readFrame(bufio.NewReader(node), nil, 0)
		if err != nil {
			nodeDone <- err
			return
		}
		hdr, err := encodeFrame(frameReadResp, f.id, &pb.RLDevServiceReadResponse{}, BlockSize)
		if err != nil {
			nodeDone <- err
			return
		}
		node.Write(hdr)
		node.Write(bytes.Repeat([]byte{0xbb}, BlockSize/2))
		close(half)                        // net.Pipe: a write returns once read, so the reader took the caller's buffer
		time.Sleep(400 * time.Millisecond) // the caller gives up meanwhile
		// The rest fails to go if the clerk ended the connection.
		_, restErr = node.Write(bytes.Repeat([]byte{0xcc}, BlockSize/2))
		nodeDone <- nil
	}()

	dst := bytes.Repeat([]byte{0xaa}, BlockSize)
	// Given up once half the reply is in (a signal, not a deadline: under
	// load a deadline could end the call before its reply began).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-half:
			// Let the reader go back to its read of the rest (it then
			// stalls there): given up before that read, the reader reads
			// the rest into nothing instead (review 42), also right.
			time.Sleep(50 * time.Millisecond)
		case <-time.After(10 * time.Second): // the node failed: end the call anyway
		}
		cancel()
	}()
	if _, err := d.Read(ctx, &pb.RLDevServiceReadRequest{Rldev: 1, Length: BlockSize}, dst); err == nil {
		t.Fatal("the read succeeded with half a reply")
	}
	// The call returned: the buffer is the caller's again.
	for i := range dst {
		dst[i] = 0x55
	}
	if err := <-nodeDone; err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	for i, b := range dst {
		if b != 0x55 {
			t.Fatalf("byte %d of the caller's buffer is %#x after the read returned (the reply's bytes landed in it later)", i, b)
		}
	}
	// Given up while the reader stalled mid-frame, the connection is cut
	// after settleGrace (the rest cannot be sent); given up before the
	// reader's next read (a slow scheduler), the rest was read into
	// nothing and the connection lives on.
	switch {
	case restErr != nil && !d.broken():
		t.Errorf("the rest of the reply failed to go (%v), yet the connection is not marked broken", restErr)
	case restErr == nil && d.broken():
		t.Errorf("the connection was cut, yet the rest of the reply went through")
	case restErr == nil:
		t.Logf("the call was given up before the reader's next read: the rest was read into nothing")
	}
}

// The common case: the reply's blocks are in the caller's buffer, and the
// answer's data is that buffer; a reply of another length gets a buffer
// of its own.
func TestReadIntoFillsCallerBuffer(t *testing.T) {
	node, clerk := net.Pipe()
	defer node.Close()
	d := &dataConn{addr: "pipe", w: newFrameWriter(clerk), wait: map[uint64]*pendingCall{}}
	go d.readLoop(clerk)
	defer d.fail(net.ErrClosed)
	go func() {
		br := bufio.NewReader(node)
		for _, n := range []int{2 * BlockSize, BlockSize} {
			f, err := readFrame(br, nil, 0)
			if err != nil {
				return
			}
			hdr, _ := encodeFrame(frameReadResp, f.id, &pb.RLDevServiceReadResponse{}, n)
			node.Write(hdr)
			node.Write(bytes.Repeat([]byte{0x77}, n))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dst := make([]byte, 2*BlockSize)
	m, err := d.Read(ctx, &pb.RLDevServiceReadRequest{Rldev: 1, Length: 2 * BlockSize}, dst)
	if err != nil {
		t.Fatal(err)
	}
	if &m.Data[0] != &dst[0] || !bytes.Equal(dst, bytes.Repeat([]byte{0x77}, 2*BlockSize)) {
		t.Fatal("the reply's blocks are not in the caller's buffer")
	}
	clear(dst)
	m, err = d.Read(ctx, &pb.RLDevServiceReadRequest{Rldev: 1, Length: 2 * BlockSize}, dst)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Data) != BlockSize || &m.Data[0] == &dst[0] || !bytes.Equal(dst, make([]byte, 2*BlockSize)) {
		t.Fatalf("a reply of %d bytes for a buffer of %d: data %d bytes, in the buffer %v", BlockSize, len(dst), len(m.Data), &m.Data[0] == &dst[0])
	}
}
