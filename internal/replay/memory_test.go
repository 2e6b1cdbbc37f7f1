package replay

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
)

// genReader reads lines made on the fly: line(i) for i from 0 to n-1, each
// followed by a newline. A large log is never held whole.
type genReader struct {
	n, i int
	line func(i int) string
	cur  string
}

func (g *genReader) Read(p []byte) (int, error) {
	total := 0
	for total < len(p) {
		if g.cur == "" {
			if g.i == g.n {
				break
			}
			g.cur = g.line(g.i) + "\n"
			g.i++
		}
		c := copy(p[total:], g.cur)
		g.cur = g.cur[c:]
		total += c
	}
	if total == 0 {
		return 0, io.EOF
	}
	return total, nil
}

// heapInUse returns the heap held after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// Long limited identities are kept as weir serve keeps them, shortened:
// 128 identities of 256 KB, each limited, leave no copy of themselves in
// the reports.
func TestLongIdentitiesShortened(t *testing.T) {
	const ids, idLen = 128, 256 << 10
	cfg, err := policy.Parse([]byte("rules:\n  - {name: ua, identity: \"header:User-Agent\", limit: 1/h, algorithm: fixed_window}\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	id := func(i int) string { return fmt.Sprintf("%03d", i) + strings.Repeat("a", idLen-3) }
	in := &genReader{n: 2 * ids, line: func(i int) string {
		return fmt.Sprintf(`198.51.100.1 - - [23/Nov/2026:09:00:%02d +0000] "GET / HTTP/1.1" 200 1 "-" "%s"`, i%60, id(i/2))
	}}
	before := heapInUse()
	reps, err := Run(context.Background(), []Input{{Name: "long.log", R: in}}, []*config.Config{cfg}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	held := int64(heapInUse()) - int64(before)
	r := ruleOf(t, reps[0], "ua")
	if r.Limited != ids || r.LimitedIdentities != ids || len(r.Top) != maxTop || len(r.Top[0].Identity) > 64 {
		t.Fatalf("%+v", r)
	}
	// The identities themselves are 32 MB.
	if held > 4<<20 {
		t.Fatalf("the reports hold %d MB", held>>20)
	}
	runtime.KeepAlive(reps)
}

// The lines waiting to be put in order are bounded in bytes, not only in
// number: a 200 MB log of 8 KB lines, all of one second (so none is due
// before the window's end), is not on the heap at the first decision;
// nor is it when most of each line is a field the replay does not keep
// (a long $remote_user), so that a record held must not keep its line.
func TestReorderBoundedInBytes(t *testing.T) {
	const lineLen, logLen = 8 << 10, 200 << 20
	pad := strings.Repeat("m", lineLen)
	for name, format := range map[string]string{
		"long user agents": `198.51.100.%d - - [23/Nov/2026:09:00:01 +0000] "GET /%d HTTP/1.1" 200 1 "-" "%s"`,
		"long users":       `198.51.100.%d - user%d%s [23/Nov/2026:09:00:01 +0000] "GET / HTTP/1.1" 200 1 "-" "ua"`,
	} {
		t.Run(name, func(t *testing.T) {
			in := &genReader{n: logLen / lineLen, line: func(i int) string { return fmt.Sprintf(format, i%200, i, pad) }}
			cfg, err := policy.Parse([]byte(twoPerMinute), "t.yaml")
			if err != nil {
				t.Fatal(err)
			}
			before := heapInUse()
			var atFirst int64 = -1
			decided := 0
			o := Options{observe: func(*Record, int, *policy.Verdict) {
				if decided++; decided == 1 {
					atFirst = int64(heapInUse()) - int64(before)
				}
			}}
			reps, err := Run(context.Background(), []Input{{Name: "long.log", R: in}}, []*config.Config{cfg}, o)
			if err != nil {
				t.Fatal(err)
			}
			if rep := reps[0]; decided != logLen/lineLen || rep.Skipped != 0 {
				t.Fatalf("decided %d lines, skipped %d %v", decided, rep.Skipped, rep.SkippedLines)
			}
			t.Logf("%d MB on the heap at the first decision", atFirst>>20)
			if atFirst > 80<<20 {
				t.Fatalf("%d MB on the heap at the first decision of a 200 MB log", atFirst>>20)
			}
		})
	}
}
