package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, c := range []struct {
		name  string
		bi    *debug.BuildInfo
		short string
	}{
		{"released", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}}}, "v1.4.0"},
		{"checkout", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "false"}}}, "devel-0123456789ab"},
		{"dirty", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}}}, "devel-abc-dirty"},
		{"nothing", nil, "devel"},
	} {
		in := fromBuildInfo(c.bi, c.bi != nil)
		if got := in.Short(); got != c.short {
			t.Errorf("%s: Short() = %q, want %q", c.name, got, c.short)
		}
		if in.GoVersion == "" {
			t.Errorf("%s: no Go version", c.name)
		}
	}
}

func TestReadInTest(t *testing.T) {
	in := Read()
	if in.Version == "" || in.GoVersion == "" {
		t.Fatalf("Read() = %+v: empty fields", in)
	}
}
