package weir_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVendoredLicences: every vendored directory (a directory under one
// named vendor) carries its own LICENSE file, and NOTICE names the
// directory and that licence file, so that a copy of weir says what it
// includes under which licence.
func TestVendoredLicences(t *testing.T) {
	notice, err := os.ReadFile("NOTICE")
	if err != nil {
		t.Fatalf("NOTICE: %v", err)
	}
	if b, err := os.ReadFile("LICENSE"); err != nil || !strings.Contains(string(b), "Apache License") || !strings.Contains(string(b), "Version 2.0") {
		t.Fatalf("LICENSE is not the Apache License 2.0 (err %v)", err)
	}
	var vendored []string
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() && filepath.Base(filepath.Dir(path)) == "vendor" {
			vendored = append(vendored, filepath.ToSlash(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(vendored) == 0 {
		t.Fatal("found no vendored directory: the dashboard vendors uPlot")
	}
	for _, dir := range vendored {
		var lic string
		for _, name := range []string{"LICENSE", "LICENSE.md", "LICENSE.txt", "COPYING"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				lic = dir + "/" + name
				break
			}
		}
		if lic == "" {
			t.Errorf("%s: vendored without a LICENSE file", dir)
			continue
		}
		if !strings.Contains(string(notice), dir+":") || !strings.Contains(string(notice), lic) {
			t.Errorf("NOTICE does not list %s with its licence file %s", dir, lic)
		}
	}
}
