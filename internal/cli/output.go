package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// Output is the -o/--output flag of a command that prints data. Both
// formats come from one Doc, so that the JSON keys are the table's headers
// (lower case, '-' as '_') and the two never drift apart.
type Output struct {
	Format string
	json   bool
}

// Register adds -o/--output and --json (an alias of -o json) to cmd.
func (o *Output) Register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.Format, "output", "o", "table", "print as a `table|json`")
	cmd.Flags().BoolVar(&o.json, "json", false, "same as -o json")
}

// Resolve checks the flag.
func (o *Output) Resolve() error {
	if o.json {
		if o.Format != "table" && o.Format != "json" {
			return Usagef("--json and -o %s disagree", o.Format)
		}
		o.Format = "json"
	}
	switch o.Format {
	case "table", "json":
		return nil
	}
	return Usagef("-o %q: want table or json", o.Format)
}

// JSON reports whether JSON was asked for.
func (o *Output) JSON() bool { return o.Format == "json" || o.json }

// Print writes d in the chosen format.
func (o *Output) Print(w io.Writer, d *Doc) error {
	if o.JSON() {
		return d.WriteJSON(w)
	}
	return d.WriteTable(w)
}

// Doc is what a command prints: scalar fields, then tables, in the order
// they were added. Lists are printed in the order given: callers sort
// them (by id or name) so that output is stable.
type Doc struct {
	items []item
}

type item struct {
	key   string
	value any    // scalar field
	text  string // its text in table format
	table *Table
}

// Field adds a scalar: "key: text" in table format, "key": value in JSON.
func (d *Doc) Field(key string, value any) {
	d.items = append(d.items, item{key: key, value: value, text: Text(value)})
}

// FieldText adds a scalar whose table text differs from its JSON value.
func (d *Doc) FieldText(key string, value any, text string) {
	d.items = append(d.items, item{key: key, value: value, text: text})
}

// Table adds a table under key (its JSON key: a list of objects).
func (d *Doc) Table(key string, headers ...string) *Table {
	t := &Table{headers: headers}
	d.items = append(d.items, item{key: key, table: t})
	return t
}

// Table is rows under headers.
type Table struct {
	headers []string
	rows    [][]Cell
}

// Cell is one value of a row: Text in the table, Value in JSON.
type Cell struct {
	Text  string
	Value any
}

// C is a cell whose table text differs from its JSON value.
func C(text string, value any) Cell { return Cell{Text: text, Value: value} }

// Row adds a row; each value is a Cell or a plain value (printed with
// Text).
func (t *Table) Row(values ...any) {
	if len(values) != len(t.headers) {
		panic(fmt.Sprintf("cli: row of %d values under %d headers", len(values), len(t.headers)))
	}
	row := make([]Cell, len(values))
	for i, v := range values {
		if c, ok := v.(Cell); ok {
			row[i] = c
		} else {
			row[i] = Cell{Text: Text(v), Value: v}
		}
	}
	t.rows = append(t.rows, row)
}

// Len is the number of rows.
func (t *Table) Len() int { return len(t.rows) }

// Key is the JSON key of a table header: "HEARD-BY" → "heard_by".
func Key(header string) string {
	return strings.ReplaceAll(strings.ToLower(header), "-", "_")
}

// Text is a value's text in a table: lists joined by commas, empty as "-".
func Text(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case string:
		if x == "" {
			return "-"
		}
		return x
	case []string:
		if len(x) == 0 {
			return "-"
		}
		return strings.Join(x, ",")
	case float64:
		// Never an exponent: 1016752, not 1.016752e+06.
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return fmt.Sprint(v)
}

// WriteTable prints fields as "key: text" lines and each table with its
// headers (an empty table not at all), separated by blank lines.
func (d *Doc) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	prev := ""
	for _, it := range d.items {
		if it.table == nil {
			if prev == "table" {
				fmt.Fprintln(tw)
			}
			fmt.Fprintf(tw, "%s: %s\n", it.key, it.text)
			prev = "field"
			continue
		}
		if len(it.table.rows) == 0 {
			continue // an empty table is [] in JSON, nothing in a table
		}
		if prev != "" {
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(tw, strings.Join(it.table.headers, "\t"))
		for _, r := range it.table.rows {
			texts := make([]string, len(r))
			for i, c := range r {
				texts[i] = c.Text
				if texts[i] == "" {
					texts[i] = "-"
				}
			}
			fmt.Fprintln(tw, strings.Join(texts, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		prev = "table"
	}
	return tw.Flush()
}

// WriteJSON prints the document as one JSON object: a field per line, a
// table as a list of objects keyed by Key(header), one compact object per
// line (so that line tools still work on it). Empty tables are [] (never
// null).
func (d *Doc) WriteJSON(w io.Writer) error {
	var b strings.Builder
	b.WriteString("{")
	for i, it := range d.items {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n  ")
		k, _ := json.Marshal(it.key)
		b.Write(k)
		b.WriteString(": ")
		if it.table == nil {
			v, err := json.Marshal(it.value)
			if err != nil {
				return err
			}
			b.Write(v)
			continue
		}
		if len(it.table.rows) == 0 {
			b.WriteString("[]")
			continue
		}
		b.WriteString("[")
		for j, r := range it.table.rows {
			if j > 0 {
				b.WriteString(",")
			}
			b.WriteString("\n    {")
			for c, cell := range r {
				if c > 0 {
					b.WriteString(",")
				}
				k, _ := json.Marshal(Key(it.table.headers[c]))
				b.Write(k)
				b.WriteString(":")
				v, err := json.Marshal(cell.Value)
				if err != nil {
					return err
				}
				b.Write(v)
			}
			b.WriteString("}")
		}
		b.WriteString("\n  ]")
	}
	b.WriteString("\n}\n")
	_, err := io.WriteString(w, b.String())
	return err
}
