package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/weir-dev/weir/internal/replay"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
)

func init() {
	register("replay", "replay an access log through a weir.yaml: what would the rules have limited, and whom", runReplay)
}

const replayUsage = `Usage: weir replay --config weir.yaml [--format auto|nginx|envoy|caddy|jsonl] [--json] [--html report.html]
                   [--compare other.yaml] [--suggest RULE [--target 1%]] LOG...

Replays access logs (nginx combined or main, Envoy's default format or its
JSON form, Caddy's JSON log, or JSON lines with --field) through the config's
rules, each request at its own timestamp, and reports per rule what it would
have limited and whom. LOG may be gzip-compressed; - reads stdin. Flags may
come before or after the logs. docs/replay.md has the details.

Flags:`

// stdin is what "-" reads; tests replace it.
var stdin io.Reader = os.Stdin

// fieldFlag collects --field NAME=FIELD[,NAME=FIELD...], repeatable.
type fieldFlag map[string]string

func (f fieldFlag) String() string {
	var parts []string
	for k, v := range f {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func (f fieldFlag) Set(s string) error {
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || k == "" || v == "" {
			return fmt.Errorf("%q is not NAME=FIELD (as in time=ts,ip=client)", kv)
		}
		f[k] = v
	}
	return nil
}

// parseShare reads "1%" or "0.01".
func parseShare(s string) (float64, error) {
	t := strings.TrimSpace(s)
	pct := strings.HasSuffix(t, "%")
	v, err := strconv.ParseFloat(strings.TrimSuffix(t, "%"), 64)
	if err != nil {
		return 0, fmt.Errorf("--target %q: want a share such as 1%% or 0.01", s)
	}
	if pct {
		v /= 100
	}
	if !(v >= 0 && v < 1) {
		return 0, fmt.Errorf("--target %q: want a share from 0%% up to (not including) 100%%", s)
	}
	return v, nil
}

func runReplay(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("weir replay", replayUsage, stderr)
	configPath := fs.String("config", "", "the weir.yaml to replay (required)")
	format := fs.String("format", replay.FormatAuto, "the log format: auto, nginx, envoy, caddy or jsonl")
	asJSON := fs.Bool("json", false, "print one JSON object (docs/replay.md has the schema)")
	htmlOut := fs.String("html", "", "also write a self-contained HTML report to this file")
	compare := fs.String("compare", "", "replay this config too and show what changes, per rule and for whom")
	suggest := fs.String("suggest", "", "find the smallest limit for this rule that keeps limited identities within --target")
	target := fs.String("target", "1%", "with --suggest: the share of the rule's identities that may be limited")
	fields := fieldFlag{}
	fs.Var(fields, "field", "with --format jsonl: NAME=FIELD,... mapping time, ip, method, uri (or path, query), host, status, header:NAME to JSON fields (dotted for nested)")
	window := fs.Duration("window", replay.DefaultWindow, "how far out of order a timestamp may be and still be decided in order")
	var logs []string
	for {
		if code, ok := parseFlags(fs, args, stdout); !ok {
			return code
		}
		if fs.NArg() == 0 {
			break
		}
		logs = append(logs, fs.Arg(0))
		args = fs.Args()[1:]
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "weir replay: "+format+"\n", a...)
		return 2
	}
	switch {
	case *configPath == "":
		return fail("--config is required")
	case len(logs) == 0:
		return fail("name at least one log (- for stdin)")
	case *suggest != "" && *compare != "":
		return fail("--suggest and --compare do not go together")
	case *suggest != "" && *htmlOut != "":
		return fail("--suggest and --html do not go together")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["target"] && *suggest == "" {
		return fail("--target goes with --suggest RULE")
	}
	cfg, err := policy.LoadFile(*configPath)
	if err != nil {
		return fail("%v", err)
	}
	opts := replay.Options{Format: *format, Fields: fields, Window: *window}
	if isTerminal(stderr) {
		opts.Progress = stderr
	}
	// The replay allocates little that lives long, and its memory is
	// bounded by max_keys: trade some of it for less garbage collection.
	debug.SetGCPercent(400)
	ctx := context.Background()
	if *suggest != "" {
		share, err := parseShare(*target)
		if err != nil {
			return fail("%v", err)
		}
		return runSuggest(ctx, logs, cfg, *suggest, share, opts, *asJSON, stdout, stderr)
	}
	cfgs := []*config.Config{cfg}
	if *compare != "" {
		other, err := policy.LoadFile(*compare)
		if err != nil {
			return fail("%v", err)
		}
		cfgs = append(cfgs, other)
	}
	ins, closeAll, err := openLogs(logs, stdin)
	if err != nil {
		return fail("%v", err)
	}
	defer closeAll()
	reps, err := replay.Run(ctx, ins, cfgs, opts)
	if err != nil {
		return fail("%v", err)
	}
	if *htmlOut != "" {
		if err := writeHTMLFile(*htmlOut, reps[0], filepath.Base(*configPath)); err != nil {
			return fail("--html: %v", err)
		}
	}
	switch {
	case *compare != "" && *asJSON:
		return printJSON(stdout, stderr, replay.Compare(reps[0], reps[1]))
	case *compare != "":
		replay.WriteCompareText(stdout, replay.Compare(reps[0], reps[1]), *configPath, *compare)
	case *asJSON:
		return printJSON(stdout, stderr, reps[0])
	default:
		replay.WriteText(stdout, reps[0])
	}
	return 0
}

func runSuggest(ctx context.Context, logs []string, cfg *config.Config, rule string, share float64, opts replay.Options, asJSON bool, stdout, stderr io.Writer) int {
	// Every pass reads the logs again: stdin is kept in a file first.
	for i, l := range logs {
		if l != "-" {
			continue
		}
		f, err := os.CreateTemp("", "weir-replay-*.log")
		if err != nil {
			fmt.Fprintln(stderr, "weir replay:", err)
			return 1
		}
		defer os.Remove(f.Name())
		_, err = io.Copy(f, stdin)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			fmt.Fprintln(stderr, "weir replay: reading stdin:", err)
			return 1
		}
		logs[i] = f.Name()
	}
	open := func() ([]replay.Input, func(), error) { return openLogs(logs, nil) }
	s, err := replay.Suggest(ctx, open, cfg, rule, share, opts)
	if err != nil {
		fmt.Fprintln(stderr, "weir replay:", err)
		return 2
	}
	if asJSON {
		return printJSON(stdout, stderr, s)
	}
	fmt.Fprintf(stdout, "# rule %s: the smallest limit under which at most %s of its %s would have been limited\n",
		s.Rule, strconv.FormatFloat(s.Target*100, 'g', -1, 64)+"%", count(s.Identities, "identity", "identities"))
	fmt.Fprintf(stdout, "# (%s, %.2f%%, would have been; %s over the log)\n",
		count(s.LimitedIdentities, "identity", "identities"), 100*float64(s.LimitedIdentities)/float64(max(s.Identities, 1)), count(s.Passes, "pass", "passes"))
	fmt.Fprintf(stdout, "limit: %s\n", s.Limit)
	return 0
}

// openLogs opens the named logs ("-" is stdin).
func openLogs(names []string, stdin io.Reader) ([]replay.Input, func(), error) {
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	var ins []replay.Input
	for _, n := range names {
		if n == "-" {
			if stdin == nil {
				closeAll()
				return nil, nil, fmt.Errorf("stdin can be read once only")
			}
			ins = append(ins, replay.Input{Name: "-", R: stdin})
			continue
		}
		f, err := os.Open(n)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		files = append(files, f)
		var size int64
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			size = fi.Size()
		}
		ins = append(ins, replay.Input{Name: n, R: f, Size: size})
	}
	return ins, closeAll, nil
}

func writeHTMLFile(path string, r *replay.Report, title string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := replay.WriteHTML(f, r, title); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func printJSON(stdout, stderr io.Writer, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintln(stderr, "weir replay:", err)
		return 1
	}
	return 0
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
