package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/ddstable"
	"github.com/grovestore/grove/internal/meta"
	"github.com/grovestore/grove/internal/transport"
	"github.com/grovestore/grove/internal/units"
)

func tableCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "table",
		Short: "DDS hash tables: create, put, get, remove; partitions and replica groups",
		Long: `Distributed hash tables (Gribble et al., "Scalable, Distributed Data Structures
for Internet Service Construction", OSDI 2000). Keys are 64-bit integers
(decimal, or 0x... hex); values are byte strings of up to 1 MiB. A table is
split into partitions by the low bits of the key (its DP map); each partition
is replicated on a group of bricks (its RG map), one brick per node, kept
identical by two-phase commit. Any replica serves a read. When a node dies, the
failure detector declares it and its brick leaves every group; the survivors
go on serving. When it comes back (or another node has room), its brick
recovers into the groups left short by copying whole partitions, writes to a
partition waiting while it is copied. A partition whose replicas grow past
[tables] split_bytes (64 MiB) splits in two, in place, on every replica;
operators split and merge partitions with grove table split and merge. A node
that holds fewer replicas of a table than another by two or more moves one
onto itself (a node added to the cluster takes its share); operators move a
replica with grove table move.
Replicas live in memory, as DDS's do: a table survives the loss of all but one
replica of each partition. grove table checkpoint writes every replica to its
node's disk (writes wait meanwhile); after the loss of every replica of a
partition (a power loss of the whole cluster), grove table restore brings it
back as of the last checkpoint.`,
		Example: `  grove table create sessions --partitions 8 --replicas 3
  grove table put sessions 42 'hello'
  grove table get sessions 42
  grove table del sessions 42
  grove table stat sessions
  grove table split sessions 01`,
	}
	cmd.AddCommand(tableCreateCmd(), tableListCmd(), tableStatCmd(), tablePutCmd(), tableGetCmd(), tableDelCmd(), tableDropCmd(),
		tableReshapeCmd(false), tableReshapeCmd(true), tableMoveCmd(), tableCheckpointCmd(), tableRestoreCmd())
	return cmd
}

// tableSession is what a table command talks through: the config service
// and a DDS library (the two-phase commit coordinator) of its own.
type tableSession struct {
	meta *meta.Client
	lib  *ddstable.Library
}

func openTable(ctx context.Context, c *cli.Client, op string) (*tableSession, error) {
	s, err := openRLDev(ctx, c, op)
	if err != nil {
		return nil, err
	}
	s.clerk.Close()
	return &tableSession{meta: s.meta, lib: ddstable.NewLibrary(ddstable.LibraryConfig{Meta: s.meta})}, nil
}

// tableRun runs fn with a table session, within the command's timeout.
func tableRun(cmd *cobra.Command, c *cli.Client, op string, fn func(ctx context.Context, s *tableSession) error) error {
	ctx, cancel := commandCtx(cmd.Context(), c)
	defer cancel()
	s, err := openTable(ctx, c, op)
	if err != nil {
		return err
	}
	defer s.Close()
	return fn(ctx, s)
}

func (s *tableSession) Close() {
	s.lib.Close()
	s.meta.Close()
}

// tableErr maps a table error to the exit codes.
func tableErr(op string, c *cli.Client, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ddstable.ErrOutcomeUnknown):
		return &cli.Error{Code: cli.ExitUnknown, Op: op, Msg: err.Error(), Hint: "read the key to see whether it took effect", Err: err}
	case errors.Is(err, ddstable.ErrNoTable):
		return &cli.Error{Code: cli.ExitNotFound, Op: op, Msg: err.Error(), Hint: "grove table list shows the tables", Err: err}
	case errors.Is(err, ddstable.ErrBadName), errors.Is(err, ddstable.ErrTooLarge):
		return &cli.Error{Code: cli.ExitUsage, Op: op, Msg: err.Error(), Err: err}
	case errors.Is(err, ddstable.ErrUnavailable):
		return &cli.Error{Code: cli.ExitUnavailable, Op: op, Msg: err.Error(), Hint: "grove table stat shows which bricks answer", Err: err}
	}
	return rldevErr(op, c, err)
}

func parseTableKey(s string) (uint64, error) {
	k, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		return 0, cli.Usagef("%q is not a key: keys are 64-bit unsigned integers (decimal, or 0x... hex)", s)
	}
	return k, nil
}

func tableCreateCmd() *cobra.Command {
	var c cli.Client
	var partitions, replicas int
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a table",
		Long: `Create table NAME with --partitions partitions (a power of two), each replicated
on --replicas bricks (one per node; at most the number of nodes). Partition i's
group is the nodes i, i+1, ... in node order, so every node holds about as many
replicas.`,
		Example: "  grove table create sessions\n  grove table create big --partitions 64 --replicas 2",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if partitions < 1 || partitions > ddstable.MaxPartitions || partitions&(partitions-1) != 0 {
				return cli.Usagef("--partitions %d: a power of two from 1 to %d", partitions, ddstable.MaxPartitions)
			}
			if replicas < 1 || replicas > ddstable.MaxReplicas {
				return cli.Usagef("--replicas %d: 1 to %d", replicas, ddstable.MaxReplicas)
			}
			if err := ddstable.CheckName(args[0]); err != nil {
				return cli.Usagef("%v", err)
			}
			return tableRun(cmd, &c, "table create", func(ctx context.Context, s *tableSession) error {
				m, err := ddstable.CreateTable(ctx, s.meta, args[0], partitions, replicas)
				if errors.Is(err, ddstable.ErrExists) {
					return &cli.Error{Code: cli.ExitFailed, Op: "table create", Msg: err.Error(), Err: err}
				}
				if errors.Is(err, ddstable.ErrTooBig) {
					return cli.Usagef("%v", err)
				}
				if errors.Is(err, ddstable.ErrTooFewBricks) {
					return &cli.Error{Code: cli.ExitFailed, Op: "table create", Msg: err.Error(), Hint: "lower --replicas, or add nodes", Err: err}
				}
				if err != nil {
					return tableErr("table create", &c, err)
				}
				fmt.Printf("table %s: %d partitions, %d replicas each\n", m.Table, m.DP.Len(), m.Replicas)
				return nil
			})
		},
	}
	cmd.Flags().IntVar(&partitions, "partitions", 4, "`N` partitions, a power of two (1 to 65536)")
	cmd.Flags().IntVar(&replicas, "replicas", 3, "replicate each partition on `R` bricks")
	c.Register(cmd, cli.DefaultCommandTimeout)
	return cmd
}

func tableDropCmd() *cobra.Command {
	var c cli.Client
	cmd := &cobra.Command{
		Use:     "drop NAME",
		Short:   "Drop a table and everything in it",
		Example: "  grove table drop sessions",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return tableRun(cmd, &c, "table drop", func(ctx context.Context, s *tableSession) error {
				return tableErr("table drop", &c, ddstable.DropTable(ctx, s.meta, args[0]))
			})
		},
	}
	c.Register(cmd, cli.DefaultCommandTimeout)
	return cmd
}

func tableListCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List the tables",
		Example: "  grove table list\n  grove table list -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			return tableRun(cmd, &c, "table list", func(ctx context.Context, s *tableSession) error {
				ts, err := ddstable.ListTables(ctx, s.meta)
				if err != nil {
					return tableErr("table list", &c, err)
				}
				d := &cli.Doc{}
				tb := d.Table("tables", "NAME", "PARTITIONS", "REPLICAS", "EPOCH", "SHORT-GROUPS", "RECOVERING", "RESHAPING", "CHECKPOINT")
				for _, m := range ts {
					short := 0
					for _, g := range m.RG {
						if len(g) < m.Replicas {
							short++
						}
					}
					ckpt := "-"
					if m.Checkpoint.ID != 0 {
						ckpt = strconv.FormatUint(m.Checkpoint.ID, 10)
					}
					if m.Freeze.ID != 0 {
						ckpt += fmt.Sprintf(" (%d running)", m.Freeze.ID)
					}
					tb.Row(m.Table, m.DP.Len(), m.Replicas, m.Epoch, short, len(m.Joining), len(m.Reshaping), ckpt)
				}
				return out.Print(os.Stdout, d)
			})
		},
	}
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

func tableStatCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "stat NAME",
		Short: "Show a table's partitions, their replica groups and each replica's keys",
		Long: `Show table NAME's partitions (by the low bits of the key, least significant
bit rightmost; * is every key) and each one's replica group, and what each
replica's brick reports: keys, bytes, operations in doubt (prepared, not yet
decided). A brick that does not answer is shown as such; a group shorter than
the table's replication degree lost a brick (it serves on with the others).`,
		Example: "  grove table stat sessions\n  grove table stat sessions -o json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			return tableRun(cmd, &c, "table stat", func(ctx context.Context, s *tableSession) error {
				ts, err := ddstable.ListTables(ctx, s.meta)
				if err != nil {
					return tableErr("table stat", &c, err)
				}
				i := slices.IndexFunc(ts, func(m *ddstable.Maps) bool { return m.Table == args[0] })
				if i < 0 {
					return tableErr("table stat", &c, fmt.Errorf("%w: %q", ddstable.ErrNoTable, args[0]))
				}
				m := ts[i]
				st := brickStatuses(ctx, s, m)
				d := &cli.Doc{}
				d.Field("table", m.Table)
				d.Field("epoch", m.Epoch)
				d.Field("replication", m.Replicas)
				if m.Checkpoint.ID != 0 {
					d.Field("checkpoint", fmt.Sprintf("%d (epoch %d)", m.Checkpoint.ID, m.Checkpoint.Epoch))
				}
				if m.Freeze.ID != 0 {
					d.Field("checkpointing", fmt.Sprintf("%d, held by brick %v: writes wait", m.Freeze.ID, m.Freeze.Holder))
				}
				tb := d.Table("replicas", "PARTITION", "GROUP", "BRICK", "KEYS", "BYTES", "IN-DOUBT", "NOTE")
				for _, p := range m.DP.Leaves() {
					g := m.RG[p]
					var names []string
					for _, b := range g {
						names = append(names, b.String())
					}
					for _, b := range g {
						r := st[b]
						note := ""
						if len(g) < m.Replicas {
							note = "short group"
						}
						if j, ok := m.Joining[p]; ok {
							note = fmt.Sprintf("brick %v recovering into the group: writes wait", j)
						}
						if r, ok := m.Replacing[p]; ok {
							note = fmt.Sprintf("brick %v moving in to replace %v: writes wait", m.Joining[p], r)
						}
						if r, ok := m.Reshaping[p]; ok {
							what := "splitting"
							if r.Merge {
								what = "merging with its sibling"
							}
							note = fmt.Sprintf("%s (held by %v): writes wait", what, r.Holder)
						}
						var rs *pb.TableReplicaStatus
						if r != nil {
							for _, x := range r.Replicas {
								if x.Table == m.Table && x.Partition.GetBits() == p.Bits && x.Partition.GetDepth() == uint32(p.Depth) {
									rs = x
								}
							}
						}
						if rs == nil {
							why := "no answer"
							if r != nil {
								why = "not serving"
							}
							tb.Row(p.String(), strings.Join(names, ","), b.String(), nil, nil, nil, why)
							continue
						}
						tb.Row(p.String(), strings.Join(names, ","), b.String(), rs.Keys,
							cli.C(units.FormatSize(int64(rs.Bytes)), rs.Bytes), rs.InDoubt, note)
					}
				}
				return out.Print(os.Stdout, d)
			})
		},
	}
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

// brickStatuses asks every brick of m's groups for its status (2 s each,
// at once; a brick that does not answer, or runs another incarnation, is
// left out).
func brickStatuses(ctx context.Context, s *tableSession, m *ddstable.Maps) map[ddstable.BrickID]*pb.TableBrickStatus {
	bricks := map[ddstable.BrickID]bool{}
	for _, g := range m.RG {
		for _, b := range g {
			bricks[b] = true
		}
	}
	book := meta.NewAddressBook(s.meta)
	defer book.Close()
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[ddstable.BrickID]*pb.TableBrickStatus{}
	for b := range bricks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			addr, err := book.Addr(sctx, b.Node)
			if err != nil {
				return
			}
			r, err := tableStatusAt(sctx, addr)
			if err == nil && r.Inc == b.Inc {
				mu.Lock()
				out[b] = r
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

func tablePutCmd() *cobra.Command {
	var c cli.Client
	cmd := &cobra.Command{
		Use:   "put NAME KEY VALUE|-",
		Short: "Set a key's value (- reads it from standard input)",
		Long: `Set KEY to VALUE in table NAME, on every replica of its partition (two-phase
commit). A write refused because another write to the key was in progress, or
because a replica's maps changed, is tried again until --command-timeout. If
the write's outcome cannot be known (exit 8), read the key.`,
		Example: "  grove table put sessions 42 hello\n  grove table put blobs 0xff - < file.bin",
		Args:    cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := parseTableKey(args[1])
			if err != nil {
				return err
			}
			value := []byte(args[2])
			if args[2] == "-" {
				if value, err = io.ReadAll(io.LimitReader(os.Stdin, ddstable.MaxValue+1)); err != nil {
					return err
				}
			}
			if len(value) > ddstable.MaxValue {
				return cli.Usagef("a value is at most %s; nothing was written", units.FormatSize(ddstable.MaxValue))
			}
			return tableRun(cmd, &c, "table put", func(ctx context.Context, s *tableSession) error {
				return tableErr("table put", &c, s.lib.Put(ctx, args[0], key, value))
			})
		},
	}
	c.Register(cmd, cli.DefaultCommandTimeout)
	return cmd
}

func tableGetCmd() *cobra.Command {
	var c cli.Client
	var raw bool
	cmd := &cobra.Command{
		Use:     "get NAME KEY",
		Short:   "Print a key's value (exit 5 if absent)",
		Example: "  grove table get sessions 42\n  grove table get blobs 0xff --raw > file.bin",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := parseTableKey(args[1])
			if err != nil {
				return err
			}
			return tableRun(cmd, &c, "table get", func(ctx context.Context, s *tableSession) error {
				v, found, err := s.lib.Get(ctx, args[0], key)
				if err != nil {
					return tableErr("table get", &c, err)
				}
				if !found {
					return &cli.Error{Code: cli.ExitNotFound, Op: "table get", Msg: fmt.Sprintf("no key %d in table %q", key, args[0])}
				}
				if raw {
					_, err = os.Stdout.Write(v)
					return err
				}
				fmt.Println(string(v))
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&raw, "raw", false, "write the value's bytes alone, without a newline")
	c.Register(cmd, cli.DefaultCommandTimeout)
	return cmd
}

func tableDelCmd() *cobra.Command {
	var c cli.Client
	cmd := &cobra.Command{
		Use:     "del NAME KEY",
		Short:   "Remove a key (removing an absent key succeeds)",
		Example: "  grove table del sessions 42",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := parseTableKey(args[1])
			if err != nil {
				return err
			}
			return tableRun(cmd, &c, "table del", func(ctx context.Context, s *tableSession) error {
				return tableErr("table del", &c, s.lib.Remove(ctx, args[0], key))
			})
		},
	}
	c.Register(cmd, cli.DefaultCommandTimeout)
	return cmd
}

func tableStatusAt(ctx context.Context, addr string) (*pb.TableBrickStatus, error) {
	var p transport.Pool
	defer p.Close()
	cc, err := p.Get(addr)
	if err != nil {
		return nil, err
	}
	return pb.NewTableServiceClient(cc).Status(ctx, &pb.TableBrickStatusRequest{})
}

// tableReshapeCmd is grove table split, or grove table merge.
func tableReshapeCmd(merge bool) *cobra.Command {
	var c cli.Client
	var noWait bool
	op, use, short, long, example := "table split", "split NAME PARTITION",
		"Split a partition of a table in two",
		`Split partition PARTITION of table NAME (as grove table stat writes it: the low
bits of the key, least significant rightmost; * for a table of one partition)
into its two children, which keep its replica group: 01 splits into 001 and
101. Writes to the partition wait while its replicas settle (every write in
flight decided everywhere); then every replica splits its own data in place,
and a decree installs the new partitions. Reads go on throughout. The group's
first brick runs it; if that brick dies, the split is given up and may be
asked again. Partitions also split on their own past [tables] split_bytes.`,
		"  grove table split sessions '*'\n  grove table split sessions 01"
	if merge {
		op, use, short, long, example = "table merge", "merge NAME PARENT",
			"Merge two partitions of a table into their parent",
			`Merge the two children of PARENT in table NAME (partitions 0PARENT and 1PARENT,
which must have the same replica group, as a split leaves them) into PARENT:
001 and 101 merge into 01; 0 and 1 into *. Writes to both wait while their
replicas settle; then every replica merges its own data in place.`,
			"  grove table merge sessions 01\n  grove table merge sessions '*'"
	}
	cmd := &cobra.Command{
		Use: use, Short: short, Long: long, Example: example,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := ddstable.CheckName(args[0]); err != nil {
				return cli.Usagef("%v", err)
			}
			p, err := ddstable.ParsePartition(args[1])
			if err != nil {
				return cli.Usagef("%v", err)
			}
			return tableRun(cmd, &c, op, func(ctx context.Context, s *tableSession) error {
				request := ddstable.RequestSplit
				if merge {
					request = ddstable.RequestMerge
				}
				m, err := request(ctx, s.meta, args[0], p)
				switch {
				case errors.Is(err, ddstable.ErrNoSuchPart), errors.Is(err, ddstable.ErrNotMergeable):
					return &cli.Error{Code: cli.ExitNotFound, Op: op, Msg: err.Error(), Hint: "grove table stat " + args[0] + " shows its partitions", Err: err}
				case errors.Is(err, ddstable.ErrReshaping), errors.Is(err, ddstable.ErrRecovering):
					return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: err.Error(), Hint: "try again once it is done (grove table stat)", Err: err}
				case errors.Is(err, ddstable.ErrGroupsDiffer), errors.Is(err, ddstable.ErrTooDeep), errors.Is(err, ddstable.ErrTooMany), errors.Is(err, ddstable.ErrTooBig):
					return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: err.Error(), Err: err}
				case err != nil:
					return tableErr(op, &c, err)
				}
				lease := p
				if merge {
					lease, _, _ = p.Children()
				}
				holder := m.Reshaping[lease].Holder
				if noWait {
					fmt.Printf("%s of %s partition %v asked (epoch %d); brick %v runs it\n", op, args[0], p, m.Epoch, holder)
					return nil
				}
				fmt.Fprintf(os.Stderr, "%s %v: brick %v waits for the replicas to settle...\n", op, p, holder)
				zero, one, _ := p.Children()
				now, err := awaitMaps(ctx, s, m, func(now *ddstable.Maps) (bool, error) {
					if merge && now.DP.Has(p) || !merge && now.DP.Has(zero) {
						return true, nil
					}
					if now.Reshaping[lease].Holder != holder {
						return false, &cli.Error{Code: cli.ExitFailed, Op: op, Msg: fmt.Sprintf("given up: brick %v's lease on %v ended without the %s (its replicas did not settle in time, or the brick died)", holder, lease, strings.TrimPrefix(op, "table ")),
							Hint: "grove table stat " + args[0] + " shows the replicas; ask again"}
					}
					return false, nil
				})
				if err != nil {
					return tableErr(op, &c, err)
				}
				if merge {
					fmt.Printf("table %s: %v and %v merged into %v (epoch %d, %d partitions)\n", args[0], zero, one, p, now.Epoch, now.DP.Len())
				} else {
					fmt.Printf("table %s: %v split into %v and %v (epoch %d, %d partitions)\n", args[0], p, zero, one, now.Epoch, now.DP.Len())
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the lease is decreed, without waiting for the end")
	c.Register(cmd, 3*time.Minute) // the holder gives up after 2 minutes
	return cmd
}

func tableMoveCmd() *cobra.Command {
	var c cli.Client
	var noWait bool
	var from, to uint64
	const op = "table move"
	cmd := &cobra.Command{
		Use:   "move NAME PARTITION --from NODE --to NODE",
		Short: "Move a partition's replica from one node to another",
		Long: `Move the replica of partition PARTITION of table NAME (as grove table stat
writes it) from node --from to node --to (DDS §3.1: a node added takes its
share). The target's brick copies the partition as a recovering brick does
(writes to the partition wait meanwhile; reads go on), the replica replaced
stops serving reads, and a decree puts the target in its place: the group
keeps its size throughout. Nodes also move replicas onto themselves on their
own when they hold two fewer of a table than another ([tables]
no_auto_rebalance turns that off).`,
		Example: "  grove table move sessions 01 --from 1 --to 4",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := ddstable.CheckName(args[0]); err != nil {
				return cli.Usagef("%v", err)
			}
			p, err := ddstable.ParsePartition(args[1])
			if err != nil {
				return cli.Usagef("%v", err)
			}
			if from == 0 || to == 0 || from == to {
				return cli.Usagef("--from and --to name two different nodes")
			}
			return tableRun(cmd, &c, op, func(ctx context.Context, s *tableSession) error {
				m, err := ddstable.RequestMove(ctx, s.meta, args[0], p, from, to)
				switch {
				case errors.Is(err, ddstable.ErrNoSuchPart), errors.Is(err, ddstable.ErrNotReplaceable), errors.Is(err, ddstable.ErrNoBrick):
					return &cli.Error{Code: cli.ExitNotFound, Op: op, Msg: err.Error(), Hint: "grove table stat " + args[0] + " shows its partitions and groups", Err: err}
				case errors.Is(err, ddstable.ErrLeaseHeld), errors.Is(err, ddstable.ErrReshaping), errors.Is(err, ddstable.ErrCheckpointing):
					return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: err.Error(), Hint: "try again once it is done (grove table stat)", Err: err}
				case errors.Is(err, ddstable.ErrGroupShort):
					return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: err.Error(), Hint: "try again once recovery has refilled the group (grove table stat)", Err: err}
				case errors.Is(err, ddstable.ErrInGroup):
					return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: fmt.Sprintf("node %d already holds a replica of %v", to, p), Err: err}
				case err != nil:
					return tableErr(op, &c, err)
				}
				target := m.Joining[p]
				if noWait {
					fmt.Printf("move of %s partition %v from node %d to brick %v asked (epoch %d)\n", args[0], p, from, target, m.Epoch)
					return nil
				}
				fmt.Fprintf(os.Stderr, "%s %v: brick %v copies the partition...\n", op, p, target)
				now, err := awaitMaps(ctx, s, m, func(now *ddstable.Maps) (bool, error) {
					if slices.Contains(now.RG[p], target) {
						return true, nil
					}
					if now.Joining[p] != target {
						return false, &cli.Error{Code: cli.ExitFailed, Op: op, Msg: fmt.Sprintf("given up: brick %v's lease on %v ended without the move (the members did not settle, the replica did not hand off, or a brick died; the target's log says which)", target, p),
							Hint: "grove table stat " + args[0] + " shows the replicas; ask again"}
					}
					return false, nil
				})
				if err != nil {
					return tableErr(op, &c, err)
				}
				if slices.ContainsFunc(now.RG[p], func(b ddstable.BrickID) bool { return b.Node == from }) {
					// A member died during the move: the group was short at
					// the join, so the replica on from stayed.
					fmt.Printf("table %s: brick %v joined %v's group, and node %d's replica stayed (a member died meanwhile); group %v (epoch %d)\n", args[0], target, p, from, now.RG[p], now.Epoch)
					return nil
				}
				fmt.Printf("table %s: %v moved from node %d to brick %v; group %v (epoch %d)\n", args[0], p, from, target, now.RG[p], now.Epoch)
				return nil
			})
		},
	}
	cmd.Flags().Uint64Var(&from, "from", 0, "the `NODE` whose replica moves (required)")
	cmd.Flags().Uint64Var(&to, "to", 0, "the `NODE` it moves to (required)")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the lease is decreed, without waiting for the end")
	c.Register(cmd, 8*time.Minute) // settle 30 s, a copy of up to 5 min, hand-off 15 s, the join
	return cmd
}

func tableCheckpointCmd() *cobra.Command {
	var c cli.Client
	cmd := &cobra.Command{
		Use:   "checkpoint NAME",
		Short: "Write every replica of a table to its node's disk",
		Long: `Checkpoint table NAME (DDS §4.1): writes to the table wait while every replica
settles (every write in flight decided everywhere), then each brick writes its
replicas to its node's disk (data_dir/dds/...; synced), and the checkpoint is
recorded in the table's maps. Reads go on throughout. A brick keeps the last
completed checkpoint of a table (and one in progress). After the loss of every replica of a partition, grove
table restore brings it back as of the last checkpoint.`,
		Example: "  grove table checkpoint sessions",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := ddstable.CheckName(args[0]); err != nil {
				return cli.Usagef("%v", err)
			}
			const op = "table checkpoint"
			return tableRun(cmd, &c, op, func(ctx context.Context, s *tableSession) error {
				start := time.Now()
				m, err := ddstable.RequestCheckpoint(ctx, s.meta, args[0])
				switch {
				case errors.Is(err, ddstable.ErrCheckpointing), errors.Is(err, ddstable.ErrReshaping), errors.Is(err, ddstable.ErrRecovering):
					return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: err.Error(), Hint: "try again once it is done (grove table stat)", Err: err}
				case err != nil:
					return tableErr(op, &c, err)
				}
				id := m.Freeze.ID
				fmt.Fprintf(os.Stderr, "checkpoint %d of %s: brick %v waits for every replica to settle and be written...\n", id, args[0], m.Freeze.Holder)
				now, err := awaitMaps(ctx, s, m, func(now *ddstable.Maps) (bool, error) {
					if now.Checkpoint.ID >= id {
						return true, nil
					}
					if now.Freeze.ID != id {
						return false, &cli.Error{Code: cli.ExitFailed, Op: op, Msg: fmt.Sprintf("checkpoint %d given up: not every replica wrote its files in time, or brick %v died", id, m.Freeze.Holder),
							Hint: "the nodes' logs say why (a full disk?); ask again"}
					}
					return false, nil
				})
				if err != nil {
					return tableErr(op, &c, err)
				}
				fmt.Printf("table %s: checkpoint %d written by every replica of its %d partitions (%v)\n", args[0], id, now.DP.Len(), time.Since(start).Round(time.Millisecond))
				return nil
			})
		},
	}
	c.Register(cmd, 3*time.Minute) // the holder gives up after 2 minutes
	return cmd
}

func tableRestoreCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "restore NAME",
		Short: "Bring back a table's lost partitions from its last checkpoint",
		Long: `Restore the partitions of table NAME whose every replica is lost (every member of
the group declared dead by the failure detector, as after a power loss of the
whole cluster) from the table's last checkpoint: a live brick whose node's disk
holds the partition's file loads it and becomes the group's only member;
recovery then copies it to other bricks. What was written to those partitions
after the checkpoint is lost. Partitions with a live replica are left alone.
Exit 0 if every lost partition was restored, 1 if some could not be (the table
says why); run it again once the failure detector has declared the old
replicas dead (a few seconds after the nodes come back).`,
		Example: "  grove table restore sessions",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := ddstable.CheckName(args[0]); err != nil {
				return cli.Usagef("%v", err)
			}
			if err := out.Resolve(); err != nil {
				return err
			}
			const op = "table restore"
			return tableRun(cmd, &c, op, func(ctx context.Context, s *tableSession) error {
				res, err := ddstable.RestoreTable(ctx, s.meta, args[0])
				if errors.Is(err, ddstable.ErrNoCheckpoint) {
					return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: err.Error(), Hint: "grove table checkpoint makes one", Err: err}
				}
				if err != nil {
					return tableErr(op, &c, err)
				}
				d := &cli.Doc{}
				tb := d.Table("partitions", "PARTITION", "RESULT", "BRICK", "KEYS")
				failed := 0
				for _, r := range res {
					switch {
					case r.Err == nil:
						tb.Row(r.Partition.String(), "restored", r.By.String(), r.Keys)
					case errors.Is(r.Err, ddstable.ErrVerdictPending):
						failed++
						tb.Row(r.Partition.String(), "lost, not yet declared dead: run again in a few seconds", nil, nil)
					case errors.Is(r.Err, ddstable.ErrLive):
						tb.Row(r.Partition.String(), "not lost: a replica is not declared dead", nil, nil)
					default:
						failed++
						tb.Row(r.Partition.String(), r.Err.Error(), nil, nil)
					}
				}
				if err := out.Print(os.Stdout, d); err != nil {
					return err
				}
				if failed > 0 {
					return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: fmt.Sprintf("%d partitions not restored", failed), Hint: "run it again once the failure detector has declared their replicas dead"}
				}
				return nil
			})
		},
	}
	c.Register(cmd, time.Minute)
	out.Register(cmd)
	return cmd
}

// awaitMaps reads table m's maps (its generation) every 100 ms until done
// says so or fails.
func awaitMaps(ctx context.Context, s *tableSession, m *ddstable.Maps, done func(*ddstable.Maps) (bool, error)) (*ddstable.Maps, error) {
	for {
		ts, err := ddstable.ListTables(ctx, s.meta)
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(ts, func(x *ddstable.Maps) bool { return x.Table == m.Table && x.Gen == m.Gen })
		if i < 0 {
			return nil, fmt.Errorf("%w: %q (dropped meanwhile)", ddstable.ErrNoTable, m.Table)
		}
		if ok, err := done(ts[i]); ok || err != nil {
			return ts[i], err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
