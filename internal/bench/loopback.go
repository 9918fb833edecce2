package bench

import (
	"context"
	"errors"
	"io"
	"net"
	"time"
)

// RunLoopback measures one hop of a replicated write's data on this
// machine: size-byte messages over a loopback TCP connection, one at a
// time for d, each answered by one byte once it has been read whole (the
// kernel's copies in and out of the socket, and the wake-ups between).
// A replicated write's data makes two such hops one after the other
// (clerk to primary, primary to secondary); fio's make none. The same
// process, the same cores: its figure drifts with the machine's as
// Grove's and fio's do.
func RunLoopback(ctx context.Context, size uint64, d time.Duration) (IOResult, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return IOResult{}, err
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		buf := make([]byte, size)
		ack := []byte{1}
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				served <- nil // the client closed
				return
			}
			if _, err := c.Write(ack); err != nil {
				served <- err
				return
			}
		}
	}()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return IOResult{}, err
	}
	ack := make([]byte, 1)
	lat, elapsed, err := runWorkers(ctx, 1, size, size, 1, true, d, func(int) int64 { return 0 },
		func(_ context.Context, _ int, _ uint64, buf []byte) error {
			if _, err := c.Write(buf); err != nil {
				return err
			}
			_, err := io.ReadFull(c, ack)
			return err
		})
	c.Close()
	if serr := <-served; err == nil && serr != nil && !errors.Is(serr, net.ErrClosed) {
		err = serr
	}
	if err != nil {
		return IOResult{}, err
	}
	return IOResult{Result: Result{System: "loopback", Concurrency: 1, Ops: len(lat), Elapsed: elapsed,
		P50: Percentile(lat, 50), P99: Percentile(lat, 99)}, Bytes: uint64(len(lat)) * size}, nil
}
