package algorithm_test

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

var update = flag.Bool("update", false, "rewrite the timeline in docs/algorithms.md")

// timeline runs every algorithm over the same traffic, a burst of 6 at t=0
// and then one request every 500ms, under "4 per 4s" (burst 4), and draws
// what each admits: # admitted, · rejected, ~ admitted but delayed.
func timeline() string {
	var at []time.Duration
	for i := 0; i < 6; i++ {
		at = append(at, 0)
	}
	for t := 500 * time.Millisecond; t <= 8*time.Second; t += 500 * time.Millisecond {
		at = append(at, t)
	}
	var b strings.Builder
	b.WriteString("limit 4 per 4s (burst 4); a burst of 6 at 0s, then one request every 0.5s\n\n")
	// The header marks whole seconds over the columns drawn below.
	const pad = 24
	col := func(i int) int { // the column of request i
		if i < 6 {
			return pad + i
		}
		return pad + 6 + 2*(i-5) - 1
	}
	axis := []byte(strings.Repeat(" ", col(len(at)-1)+3))
	for i, t := range at {
		if t%time.Second == 0 && (i == 0 || at[i-1] != t) {
			copy(axis[col(i):], fmt.Sprintf("%ds", t/time.Second))
		}
	}
	b.WriteString(strings.TrimRight(string(axis), " ") + "\n")
	start := int64(1_893_456_000_000_000) // 2030-01-01, a whole day
	for _, l := range []weir.Limit{
		{Algorithm: weir.FixedWindow, Rate: 4, Period: 4 * time.Second},
		{Algorithm: weir.SlidingLog, Rate: 4, Period: 4 * time.Second},
		{Algorithm: weir.SlidingWindow, Rate: 4, Period: 4 * time.Second},
		{Algorithm: weir.TokenBucket, Rate: 4, Period: 4 * time.Second},
		{Algorithm: weir.GCRA, Rate: 4, Period: 4 * time.Second},
		{Algorithm: weir.LeakyBucket, Rate: 4, Period: 4 * time.Second},
		{Algorithm: weir.LeakyBucket, Rate: 4, Period: 4 * time.Second, MaxDelay: 4 * time.Second},
		{Algorithm: weir.Concurrency, Rate: 4, Period: 4 * time.Second},
	} {
		p, err := l.Compile()
		if err != nil {
			panic(err)
		}
		var s algorithm.State
		name := string(l.Algorithm)
		if l.MaxDelay > 0 {
			name += " (shaping)"
		}
		fmt.Fprintf(&b, "%-*s", pad, name)
		admitted := 0
		for i, t := range at {
			d := algorithm.Take(&p, &s, start+t.Microseconds(), 1, algorithm.Exact)
			switch {
			case d.Allowed && d.Delay > 0:
				b.WriteString("~")
			case d.Allowed:
				b.WriteString("#")
			default:
				b.WriteString("·")
			}
			if d.Allowed {
				admitted++
			}
			if i >= 5 {
				b.WriteString(" ")
			}
		}
		fmt.Fprintf(&b, " %2d of %d\n", admitted, len(at))
	}
	return b.String()
}

const begin, end = "<!-- timeline:begin -->\n```text\n", "```\n<!-- timeline:end -->"

// TestTimelineDoc keeps the picture in docs/algorithms.md true to the code.
// Run `go test ./algorithm -run TestTimelineDoc -update` after changing an
// algorithm.
func TestTimelineDoc(t *testing.T) {
	const path = "../docs/algorithms.md"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i, j := strings.Index(string(doc), begin), strings.Index(string(doc), end)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the timeline markers", path)
	}
	want := timeline()
	got := string(doc[i+len(begin) : j])
	if got == want {
		return
	}
	if *update {
		out := string(doc[:i+len(begin)]) + want + string(doc[j:])
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("docs/algorithms.md's timeline is stale; run: go test ./algorithm -run TestTimelineDoc -update\nwant:\n%s", want)
}
