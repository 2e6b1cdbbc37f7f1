package weir_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNoTrackedBinaries: no file git tracks is a compiled program (ELF,
// Mach-O, PE or WebAssembly), and no tracked file has the executable bit
// unless it is a script that starts with "#!". Build outputs belong in
// .gitignore, not in the repository. The test skips outside a git checkout.
func TestNoTrackedBinaries(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	if err := exec.Command("git", "rev-parse", "--is-inside-work-tree").Run(); err != nil {
		t.Skip("not in a git checkout")
	}
	out, err := exec.Command("git", "ls-files", "--stage", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := 0
	for entry := range bytes.SplitSeq(out, []byte{0}) {
		// "<mode> <object> <stage>\t<path>"
		meta, path, ok := strings.Cut(string(entry), "\t")
		if !ok {
			continue
		}
		mode, _, _ := strings.Cut(meta, " ")
		if mode != "100644" && mode != "100755" {
			continue // a symlink or a submodule
		}
		head, err := readHead(path)
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		files++
		if kind := binaryKind(head); kind != "" {
			t.Errorf("%s is a tracked %s binary: git rm it and list it in .gitignore", path, kind)
			continue
		}
		if mode == "100755" && !bytes.HasPrefix(head, []byte("#!")) {
			t.Errorf("%s is tracked as executable but is not a script with a #! line: git update-index --chmod=-x %s", path, path)
		}
	}
	if files == 0 {
		t.Fatal("git ls-files listed no files")
	}
}

// readHead returns the first 4 KiB of the file at path.
func readHead(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, 4096)
	n, err := io.ReadFull(f, buf)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		err = nil
	}
	return buf[:n], err
}

// binaryKind names the executable format whose magic number head starts
// with, or returns "".
func binaryKind(head []byte) string {
	switch {
	case bytes.HasPrefix(head, []byte("\x7fELF")):
		return "ELF"
	case bytes.HasPrefix(head, []byte("\x00asm")):
		return "WebAssembly"
	}
	if len(head) >= 4 {
		switch binary.BigEndian.Uint32(head) {
		case 0xfeedface, 0xfeedfacf, 0xcefaedfe, 0xcffaedfe:
			return "Mach-O"
		case 0xcafebabe: // a universal Mach-O (or a Java class: no better here)
			return "Mach-O universal"
		}
	}
	// PE: a DOS "MZ" header whose e_lfanew (at 0x3c) points at "PE\0\0".
	if bytes.HasPrefix(head, []byte("MZ")) && len(head) >= 0x40 {
		off := int(binary.LittleEndian.Uint32(head[0x3c:]))
		if off >= 0x40 && off+4 <= len(head) && bytes.Equal(head[off:off+4], []byte("PE\x00\x00")) {
			return "PE"
		}
	}
	return ""
}

// TestBinaryKind: each format's magic number is recognised, and text,
// scripts and data are not.
func TestBinaryKind(t *testing.T) {
	pe := make([]byte, 0x84)
	copy(pe, "MZ")
	binary.LittleEndian.PutUint32(pe[0x3c:], 0x80)
	copy(pe[0x80:], "PE\x00\x00")
	for _, c := range []struct {
		head []byte
		want string
	}{
		{[]byte("\x7fELF\x02\x01\x01"), "ELF"},
		{[]byte("\xcf\xfa\xed\xfe\x07\x00"), "Mach-O"},
		{[]byte("\xfe\xed\xfa\xce"), "Mach-O"},
		{[]byte("\xca\xfe\xba\xbe"), "Mach-O universal"},
		{pe, "PE"},
		{[]byte("\x00asm\x01\x00\x00\x00"), "WebAssembly"},
		{[]byte("#!/bin/sh\necho hi\n"), ""},
		{[]byte("MZ is not enough"), ""},
		{[]byte("package weir\n"), ""},
		{[]byte("\x1f\x8b\x08\x00"), ""}, // gzip data
		{nil, ""},
	} {
		if got := binaryKind(c.head); got != c.want {
			t.Errorf("binaryKind(%q) = %q, want %q", c.head, got, c.want)
		}
	}
}
