package weir_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestMakeFuzzListsEveryTarget: the Makefile's FUZZ_TARGETS names every
// fuzz target of the module, each under the package that has it. A target
// listed under the wrong package is fuzzed by nothing: go test passes a
// -fuzz pattern that matches no target in the package.
func TestMakeFuzzListsEveryTarget(t *testing.T) {
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?m)^FUZZ_TARGETS :=((?:.*\\\n)*.*)$`).FindSubmatch(mk)
	if block == nil {
		t.Fatal("Makefile: no FUZZ_TARGETS")
	}
	var listed []string
	for _, f := range strings.Fields(strings.ReplaceAll(string(block[1]), "\\", " ")) {
		pkg, name, ok := strings.Cut(f, ":")
		if !ok {
			t.Fatalf("FUZZ_TARGETS: %q is not pkg:Name", f)
		}
		listed = append(listed, filepath.Clean(pkg)+":"+name)
	}

	fuzzFunc := regexp.MustCompile(`(?m)^func (Fuzz\w*)\(\w+ \*testing\.F\)`)
	var found []string
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != "." {
				return filepath.SkipDir // a nested module: make nested tests it
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range fuzzFunc.FindAllSubmatch(src, -1) {
			found = append(found, filepath.Dir(path)+":"+string(m[1]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Fatal("no fuzz targets found in the module")
	}
	slices.Sort(listed)
	slices.Sort(found)
	for _, f := range found {
		if !slices.Contains(listed, f) {
			t.Errorf("fuzz target %s is not in the Makefile's FUZZ_TARGETS", f)
		}
	}
	for _, l := range listed {
		if !slices.Contains(found, l) {
			t.Errorf("FUZZ_TARGETS lists %s, but that package has no such fuzz target", l)
		}
	}
}
