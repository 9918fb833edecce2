package rldev

import (
	"errors"
	"net"
	"testing"
	"time"
)

// A node admits a clerk's connections in the order of their sequence
// numbers: a newer one supersedes (and closes) the one before, on which
// nothing more starts (begin refuses it, under the lock that admitted the
// newer); an older or repeated one is refused. Clerks whose connections
// ended are forgotten after clerkForget, and at most clerkMax are kept.
func TestClerkConnSequencing(t *testing.T) {
	s := &Service{}
	conn := func() net.Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return a
	}
	c1 := &clientConn{c: conn(), clerk: 7, seq: 1}
	if err := s.admitClerkConn(c1); err != nil {
		t.Fatal(err)
	}
	if err := s.admitClerkConn(&clientConn{c: conn(), clerk: 7, seq: 1}); err == nil {
		t.Fatal("a second connection with the same sequence number was admitted")
	}
	c2 := &clientConn{c: conn(), clerk: 7, seq: 2}
	if err := s.admitClerkConn(c2); err != nil {
		t.Fatal(err)
	}
	if !c1.superseded {
		t.Fatal("the clerk's earlier connection is not superseded by its later one")
	}
	if _, err := c1.c.Write([]byte{0}); err == nil {
		t.Fatal("the superseded connection is still open")
	}
	if _, _, err := s.begin(&waiter{}, nil, c1); !errors.Is(err, errSuperseded) {
		t.Fatalf("a request read on the superseded connection: %v, want errSuperseded", err)
	}
	if err := s.admitClerkConn(&clientConn{c: conn(), clerk: 7, seq: 1}); err == nil {
		t.Fatal("an older connection was admitted after a newer one")
	}
	if err := s.admitClerkConn(&clientConn{c: conn(), clerk: 8, seq: 1}); err != nil {
		t.Fatalf("another clerk's first connection: %v", err)
	}
	s.endClerkConn(c1) // not the current one: no effect
	if s.mu.clerks[7].cur != c2 {
		t.Fatal("the end of a superseded connection ended the clerk's current one")
	}
	s.endClerkConn(c2)
	if err := s.admitClerkConn(&clientConn{c: conn(), clerk: 7, seq: 2}); err == nil {
		t.Fatal("a connection as old as the clerk's last, ended one, was admitted")
	}

	// Forgetting: ended long ago, or too many.
	s.mu.clerks[7].ended = time.Now().Add(-2 * clerkForget)
	for i := uint64(100); len(s.mu.clerks) < clerkMax; i++ {
		s.mu.clerks[i] = &clerkConns{seq: 1, ended: time.Now().Add(-time.Duration(i) * time.Millisecond)}
	}
	if err := s.admitClerkConn(&clientConn{c: conn(), clerk: 9, seq: 1}); err != nil {
		t.Fatal(err)
	}
	if s.mu.clerks[7] != nil {
		t.Fatal("a clerk whose connections ended more than clerkForget ago is still remembered")
	}
	if n := len(s.mu.clerks); n > clerkMax/2+2 {
		t.Fatalf("%d clerks remembered after pruning, want about %d", n, clerkMax/2)
	}
	if s.mu.clerks[8] == nil || s.mu.clerks[9] == nil {
		t.Fatal("a clerk with a connection open was forgotten")
	}
	if s.mu.clerks[100] == nil || s.mu.clerks[uint64(100+clerkMax-10)] != nil { // clerk i's ended i ms ago
		t.Fatal("pruning did not forget the clerks whose connections ended first")
	}
}
