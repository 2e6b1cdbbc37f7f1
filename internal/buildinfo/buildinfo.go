// Package buildinfo reports the version of the running weir binary, read
// from what the Go toolchain stamped into it: the main module's version
// (set by `go install …@vX.Y.Z`), the VCS revision and whether the work
// tree had uncommitted changes (set by `go build` in a checkout).
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"sync"
)

// Info is one binary's version.
type Info struct {
	// Version is the module version (v1.2.3, or a pseudo-version), or
	// "devel" for a build from a checkout, which is not versioned.
	Version string
	// Revision is the VCS commit the binary was built from ("" if unknown).
	Revision string
	// Modified reports uncommitted changes in the work tree at build time.
	Modified bool
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

var (
	once   sync.Once
	cached Info
)

// Read returns the running binary's Info.
func Read() Info {
	once.Do(func() {
		bi, ok := debug.ReadBuildInfo()
		cached = fromBuildInfo(bi, ok)
	})
	return cached
}

func fromBuildInfo(bi *debug.BuildInfo, ok bool) Info {
	in := Info{Version: "devel", GoVersion: runtime.Version()}
	if !ok || bi == nil {
		return in
	}
	if bi.GoVersion != "" {
		in.GoVersion = bi.GoVersion
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		in.Version = v
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// Short is the one-word version: the module version, or for a build from a
// checkout "devel-" and the first 12 characters of the revision, with
// "-dirty" when the tree had changes ("devel" alone when nothing is known).
func (in Info) Short() string {
	if in.Version != "devel" {
		return in.Version
	}
	s := in.Version
	if in.Revision != "" {
		r := in.Revision
		if len(r) > 12 {
			r = r[:12]
		}
		s += "-" + r
	}
	if in.Modified {
		s += "-dirty"
	}
	return s
}
