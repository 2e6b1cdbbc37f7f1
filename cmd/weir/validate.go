package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/weir-dev/weir/internal/server"
	"github.com/weir-dev/weir/internal/server/envoyrls"
	"github.com/weir-dev/weir/internal/yamlnode"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
)

func init() {
	register("validate", "check weir.yaml files and print every problem", runValidate)
}

// runValidate parses each file and prints every problem as
// "file:line:col: message". It exits 0 when every file is valid, 1 when a
// file has problems, and 2 on a usage error or a file it cannot read.
func runValidate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("weir validate", "Usage: weir validate [-q] [--envoy DIR] [weir.yaml ...]\n\nChecks configuration files for weir serve (with -middleware, for Go's policy\nmiddleware) and prints every problem as file:line:col: message. With\n--envoy, also checks a directory of envoyproxy/ratelimit files as\nweir serve --envoy-config loads it, printing its first problem as\nfile:line: message.\nExits 0 if every file is valid (printing \"ok: N rules\"), 1 if a file has\nproblems, 2 on a usage error or a file that cannot be read.\n\nFlags:", stderr)
	quiet := fs.Bool("q", false, "print nothing for valid files")
	middleware := fs.Bool("middleware", false, "check the files for Go's policy middleware, which settles cost: and count:, rather than for weir serve")
	envoyDir := fs.String("envoy", "", "a directory of envoyproxy/ratelimit YAML files to check, as weir serve --envoy-config loads it")
	envoyReserve := fs.Bool("envoy-reserve", false, "with --envoy, accept reserve: as weir serve --envoy-reserve does")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	status := 0
	if *envoyDir != "" {
		status = validateEnvoy(*envoyDir, *envoyReserve, *quiet, stdout, stderr)
		if fs.NArg() == 0 {
			return status
		}
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "weir validate: no file given")
		fs.Usage()
		return 2
	}
	for _, path := range fs.Args() {
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(stderr, "weir validate: %v\n", err)
			status = 2
			continue
		}
		cfg, err := policy.Parse(data, path)
		if err == nil && !*middleware {
			if err = server.CheckConfig(cfg, path); err != nil {
				locate(data, err)
			}
		}
		if err != nil {
			var ce *config.Error
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

// validateEnvoy checks the envoyproxy/ratelimit directory dir with the
// loader weir serve uses, printing its first problem as file:line:
// message (exit status 1), or "DIR: ok: ..." (0). A directory that
// cannot be read, or holds no configuration file, is status 2.
// reserve accepts reserve: (weir serve --envoy-reserve).
func validateEnvoy(dir string, reserve, quiet bool, stdout, stderr io.Writer) int {
	cfg, err := envoyrls.LoadDirWith(dir, envoyrls.LoadOptions{Reserve: reserve})
	if err != nil {
		var ce *envoyrls.ConfigError
		if errors.As(err, &ce) {
			fmt.Fprintln(stderr, ce.Error())
			return 1
		}
		fmt.Fprintf(stderr, "weir validate: %v\n", err)
		return 2
	}
	if !quiet {
		fmt.Fprintf(stdout, "%s: ok: %s, %s\n", dir, count(len(cfg.Domains()), "domain", "domains"), count(len(cfg.Rules()), "rule", "rules"))
	}
	return 0
}

// locate gives the problems of a *config.Error whose path is
// rules[N].FIELD the line and column of that field in data.
func locate(data []byte, err error) {
	ce, ok := err.(*config.Error)
	if !ok {
		return
	}
	root, _ := yamlnode.Decode(data)
	rules := field(root, "rules")
	if rules == nil || rules.Kind != yaml.SequenceNode {
		return
	}
	for i := range ce.Problems {
		p := &ce.Problems[i]
		idx, name, ok := strings.Cut(strings.TrimPrefix(p.Path, "rules["), "].")
		n, err := strconv.Atoi(idx)
		if !ok || err != nil || n < 0 || n >= len(rules.Content) {
			continue
		}
		if v := field(yamlnode.Resolve(rules.Content[n]), name); v != nil {
			p.Line, p.Column = v.Line, v.Column
		}
	}
}

// field returns the value of key name in mapping m, nil if none.
func field(m *yaml.Node, name string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == name {
			return yamlnode.Resolve(m.Content[i+1])
		}
	}
	return nil
}
