package replay

import (
	"strings"
	"testing"
)

// A line dated before 1970 is skipped, naming its time, under every
// algorithm (a bucketed sliding window indexed its ring by it).
func TestTimeBefore1970(t *testing.T) {
	cfg := "rules:\n  - {name: ip, limit: 5/m, algorithm: sliding_window, buckets: 6}\n"
	log := `198.51.100.1 - - [31/Dec/1969:23:59:59 +0000] "GET / HTTP/1.1" 200 1 "-" "ua"
198.51.100.1 - - [01/Jan/1970:00:30:00 +0100] "GET / HTTP/1.1" 200 1 "-" "ua"
` + nginxLine("198.51.100.1", 1, "/") + "\n"
	rep, recs := run(t, cfg, log, Options{})
	if rep.Skipped != 2 || len(recs) != 1 || recs[0].Line != 3 {
		t.Fatalf("skipped %d %+v, decided %d", rep.Skipped, rep.SkippedLines, len(recs))
	}
	for i, want := range []string{"1969-12-31T23:59:59Z", "1969-12-31T23:30:00Z"} {
		if e := rep.SkippedLines[i].Error; !strings.Contains(e, want) || !strings.Contains(e, "before 1970") {
			t.Fatalf("line %d: %q", i+1, e)
		}
	}
}

// A time that is not a finite number, or lies outside 1970 to 9999, is
// skipped, naming it, in every format; under a calendar limit such times
// made the window arithmetic loop.
func TestTimeOutOfRange(t *testing.T) {
	cfg := "rules:\n  - {name: ip, limit: 5/day, timezone: Asia/Shanghai, reset_at: \"02:00\"}\n"
	bad := []string{`"NaN"`, `"nan"`, `"Inf"`, `"-Infinity"`, `"+Inf"`, `-1e20`, `1e300`, `-1`, `"-1e20"`, `253402300800000000000`, `"10000-01-01T00:00:00Z"`}
	good := `1795424401`
	type form struct {
		name string
		o    Options
		line func(ts string) string
	}
	forms := []form{
		{"jsonl", Options{Format: FormatJSONL, Fields: map[string]string{"time": "t", "ip": "ip"}}, func(ts string) string {
			return `{"t":` + ts + `,"ip":"198.51.100.1"}`
		}},
		{"caddy", Options{Format: FormatCaddy}, func(ts string) string {
			return `{"ts":` + ts + `,"request":{"remote_ip":"198.51.100.1","method":"GET","host":"h","uri":"/"},"status":200}`
		}},
		{"envoy json", Options{Format: FormatEnvoy}, func(ts string) string {
			return `{"start_time":` + ts + `,"method":"GET","path":"/","downstream_remote_address":"198.51.100.1:1"}`
		}},
	}
	for _, f := range forms {
		t.Run(f.name, func(t *testing.T) {
			var b strings.Builder
			b.WriteString(f.line(good) + "\n")
			for _, ts := range bad {
				b.WriteString(f.line(ts) + "\n")
			}
			rep, recs := run(t, cfg, b.String(), f.o)
			if rep.Skipped != int64(len(bad)) || len(recs) != 1 {
				t.Fatalf("skipped %d of %d %+v, decided %d", rep.Skipped, len(bad), rep.SkippedLines, len(recs))
			}
			for i, l := range rep.SkippedLines {
				want := strings.Trim(bad[i], `"`)
				if !strings.Contains(l.Error, want) && !strings.Contains(l.Error, "before 1970") && !strings.Contains(l.Error, "after 9999") {
					t.Fatalf("line %d (%s): %q", l.Line, bad[i], l.Error)
				}
			}
		})
	}
	// A Caddy line whose duration takes it before 1970.
	rep, recs := run(t, cfg, `{"ts":1,"duration":2,"request":{"remote_ip":"198.51.100.1","method":"GET","host":"h","uri":"/"}}`+"\n", Options{Format: FormatCaddy})
	if rep.Skipped != 1 || len(recs) != 0 || !strings.Contains(rep.SkippedLines[0].Error, "before 1970") {
		t.Fatalf("skipped %d %+v, decided %d", rep.Skipped, rep.SkippedLines, len(recs))
	}
	// nginx's time with an offset past the end of 9999.
	rep, recs = run(t, cfg, `198.51.100.1 - - [31/Dec/9999:23:59:59 -0100] "GET / HTTP/1.1" 200 1 "-" "ua"`+"\n", Options{})
	if rep.Skipped != 1 || len(recs) != 0 || !strings.Contains(rep.SkippedLines[0].Error, "after 9999") {
		t.Fatalf("skipped %d %+v, decided %d", rep.Skipped, rep.SkippedLines, len(recs))
	}
}
