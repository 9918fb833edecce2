package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	pb "github.com/grovestore/grove/api/grovepb"
	"github.com/grovestore/grove/internal/btree"
	"github.com/grovestore/grove/internal/cli"
)

func treeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tree",
		Short: "B-link trees: create, list, drop; put, get, del, scan, count, stat",
		Long: `Named ordered trees of byte-string keys and values (Boxwood's B-link tree,
Sagiv's algorithm). Every node serves every tree: any number of nodes work on
one tree at once, coherently, through the lock service. Every operation is
atomic, durable once it returns (in the answering node's log, on two disks),
and linearizable. Keys are 1 to 1024 bytes; a key and its value together fit
in a node (about 2.6 KiB with the default 8 KiB nodes).

Keys and values are text by default; --hex reads and prints them as hex.
'grove tree get' prints the value alone and exits 5 when the key is absent
(also when the tree is unknown: the message on standard error says which).`,
		Example: `  grove tree create users
  grove tree put users alice '{"age": 31}'
  grove tree get users alice
  grove tree scan users --from a --to m --limit 10
  grove tree del users alice
  grove tree stat users`,
	}
	cmd.AddCommand(treeCreateCmd(), treeListCmd(), treeDropCmd(), treePutCmd(), treeGetCmd(), treeDelCmd(), treeScanCmd(), treeCountCmd(), treeStatCmd())
	return cmd
}

// treeCall runs call, a read, through the first endpoint that serves.
func treeCall(ctx context.Context, c *cli.Client, op string, call func(ctx context.Context, tc pb.TreeServiceClient) error) error {
	return c.Do(ctx, op, func(ctx context.Context, conn *cli.Conn) error {
		return call(ctx, pb.NewTreeServiceClient(conn))
	})
}

// treeWrite runs call, a write, through the first endpoint that serves,
// and sends it to the next only if the node proved it changed nothing
// (btree.NotApplied), as the Go client does: a write whose answer was lost
// exits with cli.ExitUnknown rather than go out twice.
func treeWrite(ctx context.Context, c *cli.Client, op string, call func(ctx context.Context, tc pb.TreeServiceClient) error) error {
	notApplied := func(err error) bool { return btree.IsNotApplied(status.Convert(err)) }
	return c.DoWrite(ctx, op, notApplied, func(ctx context.Context, conn *cli.Conn) error {
		return call(ctx, pb.NewTreeServiceClient(conn))
	})
}

// codec turns command-line text into keys and values and back.
type codec struct{ hex bool }

func (k codec) in(what, s string) ([]byte, error) {
	if !k.hex {
		return []byte(s), nil
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, cli.Usagef("%s %q is not hex: %v", what, s, err)
	}
	return b, nil
}

func (k codec) out(b []byte) string {
	if k.hex {
		return hex.EncodeToString(b)
	}
	return string(b)
}

func treeCreateCmd() *cobra.Command {
	var c cli.Client
	var nodeSize, fanout uint32
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a tree",
		Long: `Create an empty tree named NAME (letters, digits and -_., up to 128 bytes).
--node-size sets its nodes' size in bytes (8KiB to 256KiB; default 8KiB), which
bounds a key and its value together; --fanout bounds a node's entries (Boxwood
measured with 6; default: as many as fit).`,
		Example: "  grove tree create users\n  grove tree create paper --fanout 6",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return treeWrite(cmd.Context(), &c, "tree create", func(ctx context.Context, tc pb.TreeServiceClient) error {
				r, err := tc.Create(ctx, &pb.TreeCreateRequest{Name: args[0], NodeSize: nodeSize, Fanout: fanout})
				if err != nil {
					return err
				}
				fmt.Printf("%s\n", r.Tree.Name)
				return nil
			})
		},
	}
	cmd.Flags().Uint32Var(&nodeSize, "node-size", 0, "node size in `BYTES` (0: 8192)")
	cmd.Flags().Uint32Var(&fanout, "fanout", 0, "most entries in a node, `N` (0: as many as fit)")
	c.Register(cmd, 0)
	return cmd
}

func treeListCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List the trees",
		Example: "  grove tree list\n  grove tree list -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			return treeCall(cmd.Context(), &c, "tree list", func(ctx context.Context, tc pb.TreeServiceClient) error {
				r, err := tc.List(ctx, &pb.TreeListRequest{})
				if err != nil {
					return err
				}
				var d cli.Doc
				t := d.Table("trees", "NAME", "ANCHOR", "NODE-SIZE", "FANOUT")
				for _, x := range r.Trees {
					t.Row(x.Name, fmt.Sprintf("%d:%d", x.AnchorCm, x.AnchorId), x.NodeSize, x.Fanout)
				}
				if err := out.Print(os.Stdout, &d); err != nil {
					return err
				}
				if len(r.Unreadable) > 0 {
					// The readable trees are listed; the command still
					// fails, so that a script sees the directory is not
					// whole.
					return cli.Failf("tree list", "%d directory entries do not decode (a build newer than this node's wrote them, or they are damaged): %s",
						len(r.Unreadable), strings.Join(r.Unreadable, "; "))
				}
				return nil
			})
		},
	}
	out.Register(cmd)
	c.Register(cmd, 0)
	return cmd
}

func treeDropCmd() *cobra.Command {
	var c cli.Client
	cmd := &cobra.Command{
		Use:     "drop NAME",
		Short:   "Drop a tree and free every chunk it used",
		Example: "  grove tree drop users",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return treeWrite(cmd.Context(), &c, "tree drop", func(ctx context.Context, tc pb.TreeServiceClient) error {
				_, err := tc.Drop(ctx, &pb.TreeDropRequest{Name: args[0]})
				return err
			})
		},
	}
	c.Register(cmd, 0)
	return cmd
}

func condFlag(ifAbsent bool, ifEquals string, set bool, k codec) (pb.TreeCond, []byte, error) {
	switch {
	case ifAbsent && set:
		return 0, nil, cli.Usagef("--if-absent and --if-equals exclude each other")
	case ifAbsent:
		return pb.TreeCond_TREE_COND_IF_ABSENT, nil, nil
	case set:
		v, err := k.in("--if-equals", ifEquals)
		return pb.TreeCond_TREE_COND_IF_EQUALS, v, err
	}
	return pb.TreeCond_TREE_COND_ALWAYS, nil, nil
}

func treePutCmd() *cobra.Command {
	var c cli.Client
	var k codec
	var ifAbsent bool
	var ifEquals string
	cmd := &cobra.Command{
		Use:   "put NAME KEY [VALUE]",
		Short: "Set a key's value (VALUE, or standard input)",
		Long: `Set KEY to VALUE in tree NAME (VALUE omitted: standard input, to its end).
--if-absent sets it only if the key is absent; --if-equals V only if its
current value is V. A condition that does not hold changes nothing and exits
1. The put is durable (in the answering node's log, on two disks) when the
command returns. It carries a write token: if an answer is lost, the put is
sent again under it (to the next endpoint) and takes effect once; it exits 8
(outcome unknown) only if that is still so when its time ends. Keys are 1 to
1024 bytes, values up to 1 MiB (a value too large for its leaf goes to a
chunk of its own); larger ones exit 2 before anything is sent.`,
		Example: "  grove tree put users alice 31\n  grove tree put users bob 7 --if-absent\n  grove tree put users bob 8 --if-equals 7\n  cat doc.json | grove tree put docs d1",
		Args:    cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := k.in("KEY", args[1])
			if err != nil {
				return err
			}
			var val []byte
			if len(args) == 3 {
				if val, err = k.in("VALUE", args[2]); err != nil {
					return err
				}
			} else {
				var sb strings.Builder
				if _, err := bufio.NewReader(os.Stdin).WriteTo(&sb); err != nil {
					return err
				}
				if val, err = k.in("VALUE", strings.TrimSuffix(sb.String(), "\n")); err != nil {
					return err
				}
			}
			cond, expect, err := condFlag(ifAbsent, ifEquals, cmd.Flags().Changed("if-equals"), k)
			if err != nil {
				return err
			}
			if err := checkTreeEntry("tree put", key, val, expect); err != nil {
				return err
			}
			return treeWriteOnce(cmd.Context(), &c, "tree put", args[0], func(ctx context.Context, tc pb.TreeServiceClient, tok *pb.TreeWriteToken) error {
				req := &pb.TreePutRequest{Tree: args[0], Key: key, Value: val, Cond: cond, Expect: expect, Token: tok}
				r, err := btree.SendPut(ctx, tc, req)
				if err != nil {
					return err
				}
				if !r.Applied {
					msg := "the key is present"
					if cond == pb.TreeCond_TREE_COND_IF_EQUALS {
						msg = "the key is absent"
						switch {
						case r.Found && r.Repeat:
							msg = "its value was another (an earlier attempt of this put found it so; the answer came from the write's record)"
						case r.Found:
							msg = fmt.Sprintf("its value is %q", k.out(r.Prev))
						}
					}
					return &cli.Error{Code: cli.ExitFailed, Op: "tree put", Msg: "condition does not hold: " + msg}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&k.hex, "hex", false, "keys and values are hex")
	cmd.Flags().BoolVar(&ifAbsent, "if-absent", false, "only if the key is absent")
	cmd.Flags().StringVar(&ifEquals, "if-equals", "", "only if the key's value is `VALUE`")
	c.Register(cmd, 0)
	return cmd
}

func treeGetCmd() *cobra.Command {
	var c cli.Client
	var k codec
	cmd := &cobra.Command{
		Use:     "get NAME KEY",
		Short:   "Print a key's value (exit 5 if absent)",
		Example: "  grove tree get users alice\n  grove tree get blobs 00ff --hex",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := k.in("KEY", args[1])
			if err != nil {
				return err
			}
			return treeCall(cmd.Context(), &c, "tree get", func(ctx context.Context, tc pb.TreeServiceClient) error {
				r, err := tc.Get(ctx, &pb.TreeGetRequest{Tree: args[0], Key: key})
				if err != nil {
					return err
				}
				if !r.Found {
					return &cli.Error{Code: cli.ExitNotFound, Op: "tree get", Msg: fmt.Sprintf("no key %q in tree %q", args[1], args[0])}
				}
				fmt.Println(k.out(r.Value))
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&k.hex, "hex", false, "keys and values are hex")
	c.Register(cmd, 0)
	return cmd
}

func treeDelCmd() *cobra.Command {
	var c cli.Client
	var k codec
	var ifEquals string
	cmd := &cobra.Command{
		Use:   "del NAME KEY",
		Short: "Delete a key (exit 5 if absent)",
		Long: `Delete KEY from tree NAME; --if-equals V only if its value is V (exit 1 if
not). An absent key exits 5.`,
		Example: "  grove tree del users alice\n  grove tree del users bob --if-equals 8",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := k.in("KEY", args[1])
			if err != nil {
				return err
			}
			cond, expect, err := condFlag(false, ifEquals, cmd.Flags().Changed("if-equals"), k)
			if err != nil {
				return err
			}
			if err := checkTreeEntry("tree del", key, nil, expect); err != nil {
				return err
			}
			return treeWriteOnce(cmd.Context(), &c, "tree del", args[0], func(ctx context.Context, tc pb.TreeServiceClient, tok *pb.TreeWriteToken) error {
				req := &pb.TreeDeleteRequest{Tree: args[0], Key: key, Cond: cond, Expect: expect, Token: tok}
				r, err := btree.SendDelete(ctx, tc, req)
				if err != nil {
					return err
				}
				switch {
				case !r.Found:
					return &cli.Error{Code: cli.ExitNotFound, Op: "tree del", Msg: fmt.Sprintf("no key %q in tree %q", args[1], args[0])}
				case !r.Applied && r.Repeat:
					return &cli.Error{Code: cli.ExitFailed, Op: "tree del", Msg: "condition does not hold: its value was another (an earlier attempt of this delete found it so; the answer came from the write's record)"}
				case !r.Applied:
					return &cli.Error{Code: cli.ExitFailed, Op: "tree del", Msg: fmt.Sprintf("condition does not hold: its value is %q", k.out(r.Prev))}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&k.hex, "hex", false, "keys and values are hex")
	cmd.Flags().StringVar(&ifEquals, "if-equals", "", "only if the key's value is `VALUE`")
	c.Register(cmd, 0)
	return cmd
}

func treeScanCmd() *cobra.Command {
	var c cli.Client
	var k codec
	var from, to string
	var limit int
	var reverse, keysOnly bool
	cmd := &cobra.Command{
		Use:   "scan NAME",
		Short: "Print the entries of a range, one per line: key, tab, value",
		Long: `Print the entries of tree NAME with keys in [--from, --to) in key order
(--reverse: descending), at most --limit of them (0: all), one per line: key,
a tab, value (--keys-only: the key alone). The range is read in pages of up
to 256 leaves; each page is one atomic read of the tree, the whole range is
not (entries changed between pages show as they were when their page was
read).`,
		Example: "  grove tree scan users\n  grove tree scan users --from a --to m --limit 10\n  grove tree scan users --reverse --limit 1 --keys-only",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 0 {
				return cli.Usagef("--limit %d: want 0 (all) or more", limit)
			}
			fb, err := k.in("--from", from)
			if err != nil {
				return err
			}
			tb, err := k.in("--to", to)
			if err != nil {
				return err
			}
			hasTo := cmd.Flags().Changed("to")
			out := bufio.NewWriter(os.Stdout)
			defer out.Flush()
			printed := 0
			for {
				left := 0
				if limit > 0 {
					left = limit - printed
				}
				var r *pb.TreeScanResponse
				err := treeCall(cmd.Context(), &c, "tree scan", func(ctx context.Context, tc pb.TreeServiceClient) error {
					var err error
					r, err = tc.Scan(ctx, &pb.TreeScanRequest{Tree: args[0], From: fb, To: tb, HasTo: hasTo, Limit: uint32(left), Reverse: reverse, KeysOnly: keysOnly})
					return err
				})
				if err != nil {
					return err
				}
				for i, key := range r.Keys {
					if keysOnly {
						fmt.Fprintln(out, k.out(key))
					} else {
						fmt.Fprintf(out, "%s\t%s\n", k.out(key), k.out(r.Values[i]))
					}
				}
				printed += len(r.Keys)
				if !r.More || limit > 0 && printed >= limit {
					return nil
				}
				if reverse {
					tb, hasTo = r.Lo, true
				} else {
					fb = r.Hi
				}
			}
		},
	}
	cmd.Flags().BoolVar(&k.hex, "hex", false, "keys and values are hex")
	cmd.Flags().StringVar(&from, "from", "", "first `KEY` (default: the start)")
	cmd.Flags().StringVar(&to, "to", "", "end `KEY`, excluded (default: no end)")
	cmd.Flags().IntVar(&limit, "limit", 0, "most entries, `N` (0: all)")
	cmd.Flags().BoolVar(&reverse, "reverse", false, "descending order, from the end of the range")
	cmd.Flags().BoolVar(&keysOnly, "keys-only", false, "print keys only")
	c.Register(cmd, 0)
	return cmd
}

func treeCountCmd() *cobra.Command {
	var c cli.Client
	var k codec
	var from, to string
	cmd := &cobra.Command{
		Use:     "count NAME",
		Short:   "Count the keys of a range, atomically",
		Example: "  grove tree count users\n  grove tree count users --from a --to m",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			fb, err := k.in("--from", from)
			if err != nil {
				return err
			}
			tb, err := k.in("--to", to)
			if err != nil {
				return err
			}
			return treeCall(cmd.Context(), &c, "tree count", func(ctx context.Context, tc pb.TreeServiceClient) error {
				r, err := tc.Count(ctx, &pb.TreeCountRequest{Tree: args[0], From: fb, To: tb, HasTo: cmd.Flags().Changed("to")})
				if err != nil {
					return err
				}
				fmt.Println(r.Count)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&k.hex, "hex", false, "keys are hex")
	cmd.Flags().StringVar(&from, "from", "", "first `KEY` (default: the start)")
	cmd.Flags().StringVar(&to, "to", "", "end `KEY`, excluded (default: no end)")
	c.Register(cmd, 0)
	return cmd
}

func treeStatCmd() *cobra.Command {
	var c cli.Client
	var out cli.Output
	cmd := &cobra.Command{
		Use:   "stat NAME",
		Short: "A tree's height, nodes and keys, and the answering node's cache",
		Long: `Walk tree NAME (every node, through the answering node's cache) and print
its height, live nodes, keys, values kept in chunks of their own (not read:
their references are checked), removed nodes waiting for their grace period,
downlinks missing (a split whose server died; the periodic repair puts them
back), and the answering node's cache counters.`,
		Example: "  grove tree stat users\n  grove tree stat users -o json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.Resolve(); err != nil {
				return err
			}
			return treeCall(cmd.Context(), &c, "tree stat", func(ctx context.Context, tc pb.TreeServiceClient) error {
				r, err := tc.Stat(ctx, &pb.TreeStatRequest{Tree: args[0]})
				if err != nil {
					return err
				}
				hit := 0.0
				if n := r.CacheHits + r.CacheMisses; n > 0 {
					hit = float64(r.CacheHits) / float64(n)
				}
				var d cli.Doc
				d.Field("tree", r.Tree.Name)
				d.Field("height", r.Height)
				d.Field("nodes", r.Nodes)
				d.Field("keys", r.Keys)
				d.Field("value-chunks", r.ValueChunks)
				d.Field("removed", r.Removed)
				d.Field("pooled-chunks", r.PooledChunks)
				d.Field("missing-downlinks", r.MissingDownlinks)
				d.Field("node", r.Node)
				d.FieldText("cache-hit-rate", hit, fmt.Sprintf("%.1f%%", 100*hit))
				d.Field("cache-hits", r.CacheHits)
				d.Field("cache-misses", r.CacheMisses)
				d.Field("write-backs", r.WriteBacks)
				d.Field("revocations", r.Revocations)
				d.Field("fence-renewals", r.FenceRenewals)
				d.Field("stray-chunks", r.StrayChunks)
				return out.Print(os.Stdout, &d)
			})
		},
	}
	out.Register(cmd)
	c.Register(cmd, 0)
	return cmd
}
