// Command weir is the weir rate limiter's command line: it runs the service
// (weir serve), checks limits from the shell (weir check), validates
// configuration (weir validate) and drives load (weir bench).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/weir-dev/weir/internal/buildinfo"
)

// version overrides the version the build stamped (internal/buildinfo) when
// set at build time with -ldflags "-X main.version=...".
var version = ""

// binaryVersion is the version weir reports: the -X override, else the
// module version, else "devel-<revision>[-dirty]".
func binaryVersion() string {
	if version != "" {
		return version
	}
	return buildinfo.Read().Short()
}

type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{}

// register adds a subcommand; each lives in its own file.
func register(name, summary string, run func(args []string, stdout, stderr io.Writer) int) {
	commands[name] = command{summary, run}
}

const versionUsage = `Usage: weir version

Prints weir's version, the VCS revision it was built from and the Go version.

Flags:
  -h, --help
    	this help`

func init() {
	register("version", "print weir's version", func(args []string, stdout, stderr io.Writer) int {
		fs := newFlagSet("weir version", versionUsage, stderr)
		if code, ok := parseFlags(fs, args, stdout); !ok {
			return code
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "weir version: unexpected argument %q\n", fs.Arg(0))
			return 2
		}
		in := buildinfo.Read()
		fmt.Fprintln(stdout, "weir", binaryVersion())
		if in.Revision != "" {
			dirty := ""
			if in.Modified {
				dirty = " (modified)"
			}
			fmt.Fprintf(stdout, "revision %s%s\n", in.Revision, dirty)
		}
		fmt.Fprintln(stdout, "built with", in.GoVersion)
		return 0
	})
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "weir: a distributed rate limiter\n\nUsage: weir <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	width := 0
	for _, n := range names {
		width = max(width, len(n))
	}
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'weir <command> -h' for a command's flags.")
}

func main() { os.Exit(run(asPeer(os.Args, os.Stderr), os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-v" {
		args[0] = "version"
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "weir: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run(args[1:], stdout, stderr)
}

// newFlagSet returns the flag set of the command name ("weir check"), which
// writes its errors to stderr and its usage (usage, then the flags) to its
// output: stderr after a usage error, stdout after -h (see parseFlags).
func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), usage)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args into fs. When that fails, ok is false and code is
// the exit status: 0 after -h or --help, which printed the usage to stdout
// (so that "weir serve --help | less" shows it), else 2, with the error and
// the usage on fs's output, stderr.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) (code int, ok bool) {
	usage := fs.Usage
	fs.Usage = func() {} // printed below, where it belongs
	err := fs.Parse(args)
	fs.Usage = usage
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		stderr := fs.Output()
		fs.SetOutput(stdout)
		fs.Usage()
		fs.SetOutput(stderr)
		return 0, false
	}
	fs.Usage()
	return 2, false
}

// packagePrefixes are the prefixes weir's packages put on their errors
// ("weir: ", "server: ", "envoyrls: "). A command's message starts with
// its own name ("weir serve: "), which says where the error came from.
var packagePrefixes = []string{"weir", "server", "envoyrls", "policy", "redisstore"}

// errText is err's message without its packages' prefixes, so that each
// layer's context appears once: "weir serve: envoy config: open ...", not
// "weir serve: server: envoy config: envoyrls: open ...".
func errText(err error) string {
	parts := strings.Split(err.Error(), ": ")
	out := parts[:0]
	for _, p := range parts {
		if !slices.Contains(packagePrefixes, p) {
			out = append(out, p)
		}
	}
	return strings.Join(out, ": ")
}
