package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/weir-dev/weir/policy"
)

func init() {
	register("validate", "check weir.yaml files and print every problem", runValidate)
}

// runValidate parses each file and prints every problem as
// "file:line:col: message". It exits 0 when every file is valid, 1 when a
// file has problems, and 2 on a usage error or a file it cannot read.
func runValidate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("weir validate", "Usage: weir validate [-q] weir.yaml [more.yaml ...]\n\nChecks configuration files and prints every problem as file:line:col: message.\nExits 0 if every file is valid (printing \"ok: N rules\"), 1 if a file has\nproblems, 2 on a usage error or a file that cannot be read.\n\nFlags:", stderr)
	quiet := fs.Bool("q", false, "print nothing for valid files")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "weir validate: no file given")
		fs.Usage()
		return 2
	}
	status := 0
	for _, path := range fs.Args() {
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(stderr, "weir validate: %v\n", err)
			status = 2
			continue
		}
		cfg, err := policy.Parse(data, path)
		if err != nil {
			var ce *policy.ConfigError
			if errors.As(err, &ce) {
				for _, line := range ce.Lines() {
					fmt.Fprintln(stderr, line)
				}
			} else {
				fmt.Fprintf(stderr, "%s: %v\n", path, err)
			}
			status = max(status, 1)
			continue
		}
		if *quiet {
			continue
		}
		prefix := ""
		if fs.NArg() > 1 {
			prefix = path + ": "
		}
		noun := "rules"
		if len(cfg.Rules) == 1 {
			noun = "rule"
		}
		protects := ""
		if n := len(cfg.Protect); n > 0 {
			protects = fmt.Sprintf(", %d protect rule", n)
			if n > 1 {
				protects += "s"
			}
		}
		fmt.Fprintf(stdout, "%sok: %d %s%s\n", prefix, len(cfg.Rules), noun, protects)
	}
	return status
}
