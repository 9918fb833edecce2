package client

import (
	"context"
	"errors"
	"fmt"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/ddstable"
	"github.com/grovestore/grove/internal/meta"
)

// Hash tables (DDS, internal/ddstable): named tables of 64-bit keys and
// byte-string values, partitioned by the keys' low bits and replicated on
// groups of bricks by two-phase commit. The client is the tables' DDS
// library: it coordinates its own writes, so it talks to the config
// service (found through an endpoint's status) and to the bricks.
//
//	t := c.Table("sessions")
//	err = t.Put(ctx, 42, []byte("hello"))
//	v, err := t.Get(ctx, 42)            // ErrNotFound if absent
//
// A Put or Delete that returns nil is on every replica of its partition
// (in memory: see the README's "Hash tables"). One refused because another
// write to the key was in progress, or because a replica's maps changed,
// is tried again until the context ends; one whose outcome is unknown
// (the context ended mid-commit) ends with an error wrapping
// ErrUnknownOutcome and is not tried again.

// TableOptions shape a new table.
type TableOptions struct {
	Partitions int // a power of two (default 4)
	Replicas   int // per partition, at most the nodes (default 3)
}

// Table is a handle on a hash table; it makes no call.
type Table struct {
	c    *Client
	name string
}

// Table returns a handle on table name.
func (c *Client) Table(name string) *Table { return &Table{c: c, name: name} }

// Name is the table's name.
func (t *Table) Name() string { return t.name }

// library is the client's DDS library, made at the first table call from
// an endpoint's view of the config service's members.
func (c *Client) library(ctx context.Context) (*ddstable.Library, *meta.Client, error) {
	c.tables.Lock()
	defer c.tables.Unlock()
	if c.tables.closed {
		return nil, nil, fmt.Errorf("%w: the client is closed", ErrInvalid)
	}
	if c.tables.lib != nil {
		return c.tables.lib, c.tables.meta, nil
	}
	var errs []error
	for i, cc := range c.conns {
		r, err := pb.NewClusterServiceClient(cc).Status(ctx, &pb.StatusRequest{})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.eps[i], err))
			continue
		}
		var ms []meta.Member
		for _, m := range r.Members {
			if m.GrpcAddr != "" {
				ms = append(ms, meta.Member{ID: m.Id, RaftAddr: m.RaftAddr, GRPCAddr: m.GrpcAddr})
			}
		}
		if len(ms) == 0 {
			errs = append(errs, fmt.Errorf("%s: no config-service member known", c.eps[i]))
			continue
		}
		c.tables.meta = meta.NewClient(ms)
		c.tables.lib = ddstable.NewLibrary(ddstable.LibraryConfig{Meta: c.tables.meta})
		return c.tables.lib, c.tables.meta, nil
	}
	return nil, nil, fmt.Errorf("%w: %w", ErrUnavailable, errors.Join(errs...))
}

func (c *Client) closeTables() {
	c.tables.Lock()
	defer c.tables.Unlock()
	c.tables.closed = true
	if c.tables.lib != nil {
		c.tables.lib.Close()
		c.tables.meta.Close()
		c.tables.lib, c.tables.meta = nil, nil
	}
}

// tableError maps the library's errors to the client's.
func tableError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ddstable.ErrOutcomeUnknown):
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	case errors.Is(err, ddstable.ErrNoTable):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, ddstable.ErrExists):
		return fmt.Errorf("%w: %w", ErrExists, err)
	case errors.Is(err, ddstable.ErrBadName), errors.Is(err, ddstable.ErrTooLarge), errors.Is(err, ddstable.ErrTooBig),
		errors.Is(err, ddstable.ErrTooFewBricks):
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	case errors.Is(err, ddstable.ErrUnavailable):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// CreateTable creates a hash table.
func (c *Client) CreateTable(ctx context.Context, name string, o TableOptions) error {
	if o.Partitions == 0 {
		o.Partitions = 4
	}
	if o.Replicas == 0 {
		o.Replicas = 3
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	_, mc, err := c.library(ctx)
	if err != nil {
		return err
	}
	_, err = ddstable.CreateTable(ctx, mc, name, o.Partitions, o.Replicas)
	return tableError(err)
}

// DropTable drops a hash table and everything in it.
func (c *Client) DropTable(ctx context.Context, name string) error {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	lib, _, err := c.library(ctx)
	if err != nil {
		return err
	}
	return tableError(lib.Drop(ctx, name))
}

// bound gives ctx the client's CallTimeout if it has no deadline.
func (c *Client) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.opts.CallTimeout)
}

// Put sets key to value (at most 1 MiB).
func (t *Table) Put(ctx context.Context, key uint64, value []byte) error {
	ctx, cancel := t.c.bound(ctx)
	defer cancel()
	lib, _, err := t.c.library(ctx)
	if err != nil {
		return err
	}
	return tableError(lib.Put(ctx, t.name, key, value))
}

// Get returns key's value, or an error wrapping ErrNotFound if the key is
// absent (or the table is).
func (t *Table) Get(ctx context.Context, key uint64) ([]byte, error) {
	ctx, cancel := t.c.bound(ctx)
	defer cancel()
	lib, _, err := t.c.library(ctx)
	if err != nil {
		return nil, err
	}
	v, found, err := lib.Get(ctx, t.name, key)
	if err != nil {
		return nil, tableError(err)
	}
	if !found {
		return nil, fmt.Errorf("%w: key %d in table %q", ErrNotFound, key, t.name)
	}
	return v, nil
}

// Delete removes key; removing an absent key succeeds.
func (t *Table) Delete(ctx context.Context, key uint64) error {
	ctx, cancel := t.c.bound(ctx)
	defer cancel()
	lib, _, err := t.c.library(ctx)
	if err != nil {
		return err
	}
	return tableError(lib.Remove(ctx, t.name, key))
}
