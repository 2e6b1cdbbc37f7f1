package main

import (
	"maps"
	"testing"
)

// TestCount: apicount counts exported top-level names and the methods of
// exported types, per public package, leaving out test files, internal/,
// cmd/ and unexported receivers; with -fields, exported struct fields and
// interface methods too.
func TestCount(t *testing.T) {
	got, err := count("testdata/mod")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{".": 7, "sub": 2}; !maps.Equal(got, want) {
		t.Errorf("count = %v, want %v", got, want)
	}
	*withFields = true
	defer func() { *withFields = false }()
	got, err = count("testdata/mod")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{".": 9, "sub": 2}; !maps.Equal(got, want) {
		t.Errorf("count -fields = %v, want %v", got, want)
	}
}
