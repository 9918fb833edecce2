package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/chunk"
	"github.com/grovestore/grove/internal/cli"
	"github.com/grovestore/grove/internal/units"
)

func chunkCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "chunk",
		Short: "The chunk store: allocate, write, read and free chunks; manager status",
		Long: `Chunks are runs of bytes on RLDevs, allocated and freed by chunk manager pairs
(Boxwood's chunk manager: "a memory allocator for disks"). A handle, printed by
'grove chunk alloc' as CM:ID, names a chunk for good: its ID is never handed out
again, across frees, failovers and restarts. Each pair runs on two nodes: the
primary allocates and frees, either serves reads and writes; when the primary's
node dies the other takes over.`,
		Example: `  h=$(grove chunk alloc 64KiB)
  grove chunk write $h data.bin
  grove chunk read $h --length 100 | xxd
  grove chunk free $h
  grove chunk stat`,
	}
	cmd.AddCommand(chunkAllocCmd(), chunkWriteCmd(), chunkReadCmd(), chunkFreeCmd(), chunkStatCmd(), chunkAddPairCmd(), chunkGrowCmd())
	return cmd
}

// chunkErr maps a chunk-store error to the exit codes.
func chunkErr(op string, c *cli.Client, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, chunk.ErrUnallocated), errors.Is(err, chunk.ErrUnknownManager):
		return &cli.Error{Code: cli.ExitNotFound, Op: op, Msg: err.Error(), Hint: "a handle is what grove chunk alloc printed; a freed one is never valid again", Err: err}
	case errors.Is(err, chunk.ErrBadHandle), errors.Is(err, chunk.ErrBadRequest), errors.Is(err, chunk.ErrOutOfRange), errors.Is(err, chunk.ErrTooLarge):
		return &cli.Error{Code: cli.ExitUsage, Op: op, Msg: err.Error(), Err: err}
	case errors.Is(err, chunk.ErrFull), errors.Is(err, chunk.ErrMapFull):
		return &cli.Error{Code: cli.ExitFailed, Op: op, Msg: err.Error(), Hint: "grove chunk stat shows each pair's free space", Err: err}
	case errors.Is(err, chunk.ErrNotServing), errors.Is(err, chunk.ErrNotPrimary):
		return &cli.Error{Code: cli.ExitUnavailable, Op: op, Msg: err.Error(), Hint: "grove chunk stat shows the managers' state", Err: err}
	}
	return rldevErr(op, c, err)
}

func parseHandle(s string) (chunk.Handle, error) {
	h, err := chunk.ParseHandle(s)
	if err != nil {
		return chunk.Handle{}, cli.Usagef("%v", err)
	}
	return h, nil
}

// chunkSession is what a chunk command talks through.
type chunkSession struct {
	*rldevSession
	chunks *chunk.Clerk
}

func openChunk(ctx context.Context, c *cli.Client, op string) (*chunkSession, error) {
	s, err := openRLDev(ctx, c, op)
	if err != nil {
		return nil, err
	}
	return &chunkSession{rldevSession: s, chunks: chunk.NewClerk(s.meta)}, nil
}

func (s *chunkSession) Close() {
	s.chunks.Close()
	s.rldevSession.Close()
}

func chunkAllocCmd() *cobra.Command {
	var c cli.Client
	var cm uint32
	var count, batch int
	cmd := &cobra.Command{
		Use:   "alloc SIZE",
		Short: "Allocate a zeroed chunk of SIZE bytes and print its handle",
		Long: `Allocate a chunk of SIZE bytes (1 byte to 64MiB; 4096, 64KiB...), zeroed, and
print its handle alone on its line. The chunk is durable in its pair's map (on
an RLDev) and known to both managers when the command returns. The pairs take
allocations in turn (--cm picks one); a full pair passes on to the next.

--count N allocates N chunks, a handle per line as each is allocated. With
--batch B they are batched at the clerk (Boxwood §4.3): B chunks are reserved
in one request, handed out here without asking, and committed in one more;
a handle is printed as it is handed out. If the command dies before its
commit, every chunk it printed is kept allocated by the pair's primary once
the reservation's life has passed (60 s by default; grove up
--chunk-reservation-life), and until then reads as "not yet sent"; the chunks
it had not handed out leak. No handle is ever handed out twice.`,
		Example: `  grove chunk alloc 8KiB
  h=$(grove chunk alloc 1MiB --cm 2)
  grove chunk alloc 8KiB --count 1000 --batch 100`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := units.ParseSize(args[0])
			if err != nil || n <= 0 || n > chunk.MaxChunk {
				return cli.Usagef("SIZE %q: want 1 byte to %s", args[0], units.FormatSize(chunk.MaxChunk))
			}
			if count < 1 {
				return cli.Usagef("--count %d: want at least 1", count)
			}
			if batch < 1 || batch > chunk.MaxReserve {
				return cli.Usagef("--batch %d: want 1 (no batching) to %d", batch, chunk.MaxReserve)
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openChunk(ctx, &c, "chunk alloc")
			if err != nil {
				return err
			}
			defer s.Close()
			if batch == 1 {
				for i := 0; i < count; i++ {
					h, err := s.chunks.Allocate(ctx, uint64(n), cm)
					if err != nil {
						return chunkErr("chunk alloc", &c, err)
					}
					fmt.Println(h)
				}
				return nil
			}
			b, err := s.chunks.NewBatcher(uint64(n), chunk.BatcherOptions{CM: cm, Count: batch})
			if err != nil {
				return chunkErr("chunk alloc", &c, err)
			}
			for i := 0; i < count; i++ {
				h, err := b.Allocate(ctx)
				if err != nil {
					return chunkErr("chunk alloc", &c, err)
				}
				fmt.Println(h)
			}
			if err := b.Close(ctx); err != nil {
				return chunkErr("chunk alloc", &c, err)
			}
			return nil
		},
	}
	cmd.Flags().Uint32Var(&cm, "cm", 0, "allocate from chunk manager pair `N` (0: the pairs in turn)")
	cmd.Flags().IntVar(&count, "count", 1, "allocate `N` chunks, a handle per line")
	cmd.Flags().IntVar(&batch, "batch", 1, "batch `B` allocations at the clerk (1: none)")
	c.Register(cmd, cli.DefaultCommandTimeout)
	return cmd
}

func chunkWriteCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	var offSpec string
	cmd := &cobra.Command{
		Use:   "write HANDLE [FILE|-]",
		Short: "Write a file (or stdin) into a chunk",
		Long: `Write FILE (or stdin, with - or no FILE) at --offset of the chunk HANDLE. Any
offset and length inside the chunk; a write past its end is refused (nothing
written). The command returns once every byte is durable on both replicas of
the chunk's RLDev. A write that fails part way may have landed in part: the
error says so.`,
		Example: `  grove chunk write 1:5 data.bin
  echo hello | grove chunk write 1:5 - --offset 100`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			h, err := parseHandle(args[0])
			if err != nil {
				return err
			}
			off, err := units.ParseSize(offSpec)
			if err != nil || off < 0 {
				return cli.Usagef("--offset %q: want a number of bytes (0, 4096, 1MiB...)", offSpec)
			}
			r := io.Reader(os.Stdin)
			if len(args) == 2 && args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return cli.Failf("chunk write", "%v", err)
				}
				defer f.Close()
				r = f
			}
			data, err := io.ReadAll(io.LimitReader(r, chunk.MaxChunk+1))
			if err != nil {
				return cli.Failf("chunk write", "reading the input: %v", err)
			}
			if len(data) > chunk.MaxChunk {
				return cli.Usagef("the input is larger than any chunk (%s)", units.FormatSize(chunk.MaxChunk))
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openChunk(ctx, &c, "chunk write")
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.chunks.Write(ctx, h, uint64(off), data); err != nil {
				return chunkErr("chunk write", &c, err)
			}
			d := &cli.Doc{}
			d.FieldText("written", len(data), fmt.Sprintf("wrote %s (%d bytes) to chunk %s at %d", units.FormatSize(int64(len(data))), len(data), h, off))
			d.Field("handle", h.String())
			d.Field("offset", off)
			return out.Print(os.Stdout, d)
		},
	}
	cmd.Flags().StringVar(&offSpec, "offset", "0", "write at byte `N` of the chunk")
	c.Register(cmd, 60*time.Second)
	out.Register(cmd)
	return cmd
}

func chunkReadCmd() *cobra.Command {
	var c cli.Client
	var offSpec, lenSpec string
	cmd := &cobra.Command{
		Use:   "read HANDLE",
		Short: "Read bytes of a chunk to stdout",
		Long: `Read --length bytes (default: to the chunk's end) at --offset of the chunk
HANDLE to stdout. A freed, never-allocated or malformed handle is an error,
never data.`,
		Example: `  grove chunk read 1:5 > out.bin
  grove chunk read 1:5 --offset 100 --length 6`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := parseHandle(args[0])
			if err != nil {
				return err
			}
			off, err := units.ParseSize(offSpec)
			if err != nil || off < 0 {
				return cli.Usagef("--offset %q: want a number of bytes", offSpec)
			}
			n := int64(-1)
			if lenSpec != "" {
				if n, err = units.ParseSize(lenSpec); err != nil || n < 0 {
					return cli.Usagef("--length %q: want a number of bytes", lenSpec)
				}
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openChunk(ctx, &c, "chunk read")
			if err != nil {
				return err
			}
			defer s.Close()
			if n < 0 { // to the end: the chunk's length from a manager of its pair
				size, err := chunkSize(ctx, s, h)
				if err != nil {
					return chunkErr("chunk read", &c, err)
				}
				if uint64(off) > size {
					return chunkErr("chunk read", &c, fmt.Errorf("%w: offset %d of chunk %s (%d bytes)", chunk.ErrOutOfRange, off, h, size))
				}
				n = int64(size) - off
			}
			data, err := s.chunks.Read(ctx, h, uint64(off), uint64(n))
			if err != nil {
				return chunkErr("chunk read", &c, err)
			}
			if _, err := os.Stdout.Write(data); err != nil {
				return cli.Failf("chunk read", "writing the output: %v", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&offSpec, "offset", "0", "read from byte `N` of the chunk")
	cmd.Flags().StringVar(&lenSpec, "length", "", "read `N` bytes (default: to the chunk's end)")
	c.Register(cmd, 60*time.Second)
	return cmd
}

// chunkSize asks the managers of h's pair for its length (a read of zero
// bytes first checks that it is allocated).
func chunkSize(ctx context.Context, s *chunkSession, h chunk.Handle) (uint64, error) {
	if _, err := s.chunks.Read(ctx, h, 0, 0); err != nil {
		return 0, err
	}
	t, err := s.chunks.Table(ctx, false)
	if err != nil {
		return 0, err
	}
	p := t.Pairs[h.CM]
	if p == nil {
		return 0, fmt.Errorf("%w: %d", chunk.ErrUnknownManager, h.CM)
	}
	for _, node := range []uint64{p.PrimaryNode(), p.Peer(p.PrimaryNode())} {
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		r, err := s.chunks.Stat(sctx, node, h.CM, h.ID)
		cancel()
		if err == nil && r.Length > 0 {
			return r.Length, nil
		}
	}
	return 0, fmt.Errorf("%w: no manager of pair %d reports chunk %s's length", chunk.ErrNotServing, h.CM, h)
}

func chunkFreeCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "free HANDLE",
		Short: "Free a chunk (its handle is never valid again)",
		Long: `Free the chunk HANDLE. Its space is reused after a quarantine (30 s, so that a
write that failed late cannot land in another chunk); its handle is never
handed out again. Freeing a chunk that is not allocated is an error.`,
		Example: `  grove chunk free 1:5`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			h, err := parseHandle(args[0])
			if err != nil {
				return err
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openChunk(ctx, &c, "chunk free")
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.chunks.Free(ctx, h); err != nil {
				return chunkErr("chunk free", &c, err)
			}
			d := &cli.Doc{}
			d.FieldText("freed", h.String(), "freed chunk "+h.String())
			return out.Print(os.Stdout, d)
		},
	}
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

func chunkStatCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "stat",
		Short: "Show the chunk manager pairs: nodes, roles, RLDevs, space used and free",
		Long: `Show every chunk manager pair: its nodes (the primary the config service names
first), its map and data RLDevs, and what each of its managers reports: role
(primary, secondary, taking over, joining, waiting, failed), chunks, free and
quarantined space, the map's log use and LSN, and (at the primary) whether the
secondary is up to date. A manager that does not answer is shown as such.`,
		Example: `  grove chunk stat
  grove chunk stat -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openChunk(ctx, &c, "chunk stat")
			if err != nil {
				return err
			}
			defer s.Close()
			t, err := s.chunks.Table(ctx, true)
			if err != nil {
				return chunkErr("chunk stat", &c, err)
			}
			return out.Print(os.Stdout, chunkStatDoc(t, managerStatuses(ctx, s, t)))
		},
	}
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

// managerStatuses asks every node of a pair for its managers' status (2 s
// each, at once; a node that does not answer is left out).
func managerStatuses(ctx context.Context, s *chunkSession, t *chunk.Table) map[[2]uint64]*pb.ChunkManagerStatus {
	nodes := map[uint64]bool{}
	for _, p := range t.Pairs {
		nodes[p.Nodes[0]], nodes[p.Nodes[1]] = true, true
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[[2]uint64]*pb.ChunkManagerStatus{}
	for n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if r, err := s.chunks.Stat(sctx, n, 0, 0); err == nil {
				mu.Lock()
				for _, m := range r.Managers {
					out[[2]uint64{uint64(m.Cm), n}] = m
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

func chunkStatDoc(t *chunk.Table, st map[[2]uint64]*pb.ChunkManagerStatus) *cli.Doc {
	d := &cli.Doc{}
	d.Field("version", t.Version)
	tb := d.Table("managers", "CM", "NODE", "ROLE", "INCARNATION", "CHUNKS", "USED", "FREE", "LARGEST-FREE", "QUARANTINED", "LOG", "LSN", "MAP-RLDEV", "DATA-RLDEVS", "NOTE")
	ids := t.IDs()
	for _, id := range ids {
		p := t.Pairs[id]
		var data []string
		var total uint64
		for _, dr := range p.Data {
			data = append(data, strconv.FormatUint(dr.ID, 10))
			total += dr.Blocks
		}
		nodes := []uint64{p.PrimaryNode(), p.Peer(p.PrimaryNode())}
		for _, n := range nodes {
			m := st[[2]uint64{uint64(id), n}]
			if m == nil {
				tb.Row(id, n, "no answer", nil, nil, nil, nil, nil, nil, nil, nil, p.MapRLDev, data, "")
				continue
			}
			note := m.Error
			if m.Peer != "" {
				note = m.Peer
			}
			used := (total - min(total, m.FreeBlocks+m.QuarantinedBlocks+uint64(len(p.Data)))) * chunk.BlockSize
			if m.Role != "primary" && m.Role != "secondary" {
				used = 0
			}
			tb.Row(id, n, m.Role, m.Incarnation, m.Chunks,
				cli.C(units.FormatSize(int64(used)), used),
				cli.C(units.FormatSize(int64(m.FreeBlocks*chunk.BlockSize)), m.FreeBlocks*chunk.BlockSize),
				cli.C(units.FormatSize(int64(m.Largest*chunk.BlockSize)), m.Largest*chunk.BlockSize),
				cli.C(units.FormatSize(int64(m.QuarantinedBlocks*chunk.BlockSize)), m.QuarantinedBlocks*chunk.BlockSize),
				cli.C(fmt.Sprintf("%d/%d", m.LogUsed, m.LogBlocks), m.LogUsed), m.Lsn, p.MapRLDev, data, note)
		}
	}
	return d
}

func chunkAddPairCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	var nodesSpec, sizeSpec string
	cmd := &cobra.Command{
		Use:   "add-pair --nodes A,B",
		Short: "Add a chunk manager pair on two nodes (by decree)",
		Long: `Add a chunk manager pair whose managers run on nodes A and B (A its first
primary): a map RLDev (1/64 of --size, at least 1MiB) and a data RLDev of
--size, each with its segments on those two nodes' disks, then the pair's
record. The managers start on their own. Two decrees in two namespaces: a
crash between them leaves the RLDevs unused (grove rldev list shows them).`,
		Example: `  grove chunk add-pair --nodes 1,3 --size 4GiB`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			var a, b uint64
			if _, err := fmt.Sscanf(nodesSpec, "%d,%d", &a, &b); err != nil || a == 0 || b == 0 || a == b {
				return cli.Usagef("--nodes %q: want two different node ids, A,B", nodesSpec)
			}
			size, err := units.ParseSize(sizeSpec)
			if err != nil || size < 1<<20 || size%4096 != 0 {
				return cli.Usagef("--size %q: want at least 1MiB, a multiple of 4KiB", sizeSpec)
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openChunk(ctx, &c, "chunk add-pair")
			if err != nil {
				return err
			}
			defer s.Close()
			mapSize := max(1<<20, uint64(size)/64/4096*4096)
			p, err := chunk.CreatePair(ctx, s.meta, [2]uint64{a, b}, mapSize, uint64(size))
			if err != nil {
				return chunkErr("chunk add-pair", &c, err)
			}
			return out.Print(os.Stdout, pairDoc(p, fmt.Sprintf("added chunk manager pair %d on nodes %d and %d", p.ID, a, b)))
		},
	}
	cmd.Flags().StringVar(&nodesSpec, "nodes", "", "run the managers on nodes `A,B` (A the first primary)")
	cmd.Flags().StringVar(&sizeSpec, "size", "1GiB", "give the pair a data RLDev of `SIZE`")
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

func chunkGrowCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	var sizeSpec string
	cmd := &cobra.Command{
		Use:   "grow CM",
		Short: "Add a data RLDev to chunk manager pair CM (by decree)",
		Long: `Add a data RLDev of --size to chunk manager pair CM, with its segments on the
pair's two nodes. The pair's managers load their map again, knowing it (the
primary takes over anew: allocations and frees pause for about a second;
reads and writes go on), and allocations go to the RLDev with the most free
space.`,
		Example: `  grove chunk grow 1 --size 4GiB`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			cm, err := strconv.ParseUint(args[0], 10, 32)
			if err != nil || cm == 0 {
				return cli.Usagef("CM %q: want a chunk manager pair's id (grove chunk stat)", args[0])
			}
			size, err := units.ParseSize(sizeSpec)
			if err != nil || size < 1<<20 || size%4096 != 0 {
				return cli.Usagef("--size %q: want at least 1MiB, a multiple of 4KiB", sizeSpec)
			}
			ctx, cancel := commandCtx(cmd.Context(), &c)
			defer cancel()
			s, err := openChunk(ctx, &c, "chunk grow")
			if err != nil {
				return err
			}
			defer s.Close()
			p, err := chunk.AddData(ctx, s.meta, uint32(cm), uint64(size))
			if err != nil {
				return chunkErr("chunk grow", &c, err)
			}
			d := p.Data[len(p.Data)-1]
			return out.Print(os.Stdout, pairDoc(p, fmt.Sprintf("added data RLDev %d (%s) to chunk manager pair %d", d.ID, units.FormatSize(int64(d.Blocks*chunk.BlockSize)), p.ID)))
		},
	}
	cmd.Flags().StringVar(&sizeSpec, "size", "1GiB", "add a data RLDev of `SIZE`")
	c.Register(cmd, cli.DefaultCommandTimeout)
	out.Register(cmd)
	return cmd
}

func pairDoc(p *chunk.Pair, text string) *cli.Doc {
	d := &cli.Doc{}
	d.FieldText("cm", p.ID, text)
	d.Field("nodes", []string{strconv.FormatUint(p.Nodes[0], 10), strconv.FormatUint(p.Nodes[1], 10)})
	d.Field("map_rldev", p.MapRLDev)
	var data []string
	for _, x := range p.Data {
		data = append(data, strconv.FormatUint(x.ID, 10))
	}
	d.Field("data_rldevs", data)
	return d
}
