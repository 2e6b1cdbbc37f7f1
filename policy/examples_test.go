package policy

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"

	"github.com/weir-dev/weir/policy/config"
)

// notWeirMarker opts a YAML file under examples/ out of TestExamplesValidate:
// a first line of "# weir: not a weir config" marks proxy, Compose or
// Kubernetes files that merely live beside the weir configs.
const notWeirMarker = "# weir: not a weir config"

// TestExamplesValidate parses every YAML file under examples/, except the
// envoyproxy/ratelimit configs in examples/envoy/ and files marked with
// notWeirMarker, and builds a Policy from each.
func TestExamplesValidate(t *testing.T) {
	root := filepath.Join("..", "examples")
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == filepath.Join(root, "envoy") {
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(path); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.HasPrefix(data, []byte(notWeirMarker)) {
			return nil
		}
		n++
		cfg, err := Parse(data, path)
		if err != nil {
			t.Errorf("%v", err)
			return nil
		}
		cfg.Store.Type, cfg.Store.Redis = config.StoreMemory, config.RedisConfig{} // build without Redis
		if _, err := New(cfg, nil); err != nil {
			t.Errorf("%s: New: %v", path, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("only %d example configs found", n)
	}
}

// TestDocExamples parses every ```yaml block of docs/configuration.md that
// is a whole config (it has a top-level key), so the reference cannot rot.
func TestDocExamples(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(data), "```yaml\n")
	n := 0
	for i, b := range blocks[1:] {
		end := strings.Index(b, "```")
		if end < 0 {
			t.Fatalf("block %d is not closed", i+1)
		}
		doc := b[:end]
		if strings.HasPrefix(doc, "# fragment") {
			continue
		}
		n++
		if _, err := Parse([]byte(doc), fmt.Sprintf("configuration.md block %d", i+1)); err != nil {
			t.Errorf("docs/configuration.md yaml block %d:\n%s\n%v", i+1, doc, err)
		}
	}
	if n < 10 {
		t.Fatalf("only %d yaml blocks checked", n)
	}
}

// TestConfigurationContents: the list of contents at the top of
// docs/configuration.md links every ## and ### section, in order, by the
// anchor GitHub gives its heading, and nothing else.
func TestConfigurationContents(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	var headings, contents []string
	inCode := false
	for line := range strings.Lines(string(data)) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		switch {
		case inCode:
		case strings.HasPrefix(line, "## "), strings.HasPrefix(line, "### "):
			level, title, _ := strings.Cut(line, " ")
			headings = append(headings, fmt.Sprintf("%d [%s](#%s)", len(level)-2, title, anchor(title)))
		case len(headings) == 0 && (strings.HasPrefix(line, "- [") || strings.HasPrefix(line, "  - [")):
			indent := len(line) - len(strings.TrimLeft(line, " "))
			contents = append(contents, fmt.Sprintf("%d %s", indent/2, strings.TrimPrefix(strings.TrimSpace(line), "- ")))
		}
	}
	if len(headings) < 10 || strings.Join(contents, "\n") != strings.Join(headings, "\n") {
		t.Errorf("docs/configuration.md's contents list:\n%s\nwant one line per section:\n%s", strings.Join(contents, "\n"), strings.Join(headings, "\n"))
	}
}

// anchor is the fragment GitHub gives a heading: lower case, spaces as
// hyphens, punctuation other than - and _ dropped.
func anchor(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
