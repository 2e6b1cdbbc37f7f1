package replay

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
)

// terminalSafe fails when out holds a byte or character a terminal would
// act on: a control character other than newline, DEL, a C1 control, a
// bidirectional override, or invalid UTF-8 (a lone 0x9b is CSI to an
// 8-bit terminal).
func terminalSafe(t *testing.T, what, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Fatalf("%s: invalid UTF-8:\n%q", what, out)
	}
	for _, r := range out {
		if (r < 0x20 && r != '\n') || (r >= 0x7f && r <= 0x9f) || r == 0x202e || r == 0x2066 {
			t.Fatalf("%s: character %U reaches the terminal:\n%q", what, r, out)
		}
	}
}

// The terminal reports never print control characters or escape
// sequences a hostile log carries: such an identity, input name or
// skipped line's error is shown quoted, with escapes.
func TestTextReportQuotesControlCharacters(t *testing.T) {
	hostile := []string{
		"\x1b]0;owned\x07\x1b[2J",  // set the title, clear the screen
		"evil\u202edcba",           // a bidirectional override
		"c1\u009b31m",              // CSI as a C1 control
		"raw\x9b31m",               // CSI as a lone byte
		"tab\there\rcarriage\x7f!", // other controls
	}
	var log strings.Builder
	for _, h := range hostile {
		for i := 0; i < 2; i++ {
			log.WriteString(`198.51.100.1 - - [23/Nov/2026:09:00:01 +0000] "GET / HTTP/1.1" 200 1 "-" "` + h + `"` + "\n")
		}
	}
	log.WriteString("\x1b[31mnot a log line\n")
	cfg, err := policy.Parse([]byte("rules:\n  - {name: ua, identity: \"header:User-Agent\", limit: 1/h, algorithm: fixed_window}\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	name := "a\x1b[8m.log"
	ins := []Input{{Name: name, R: strings.NewReader(log.String())}, {Name: "b.log", R: strings.NewReader(log.String())}}
	reps, err := Run(context.Background(), ins, []*config.Config{cfg, cfg}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := ruleOf(t, reps[0], "ua")
	if r.LimitedIdentities != int64(len(hostile)) || reps[0].Skipped != 2 {
		t.Fatalf("%+v, skipped %d", r, reps[0].Skipped)
	}
	var out bytes.Buffer
	WriteText(&out, reps[0])
	terminalSafe(t, "WriteText", out.String())
	if !strings.Contains(out.String(), `"\x1b]0;owned\a\x1b[2J"`) || !strings.Contains(out.String(), `"evil\u202edcba"`) || !strings.Contains(out.String(), `"a\x1b[8m.log":`) {
		t.Fatalf("the identities and the input are not shown quoted:\n%s", out.String())
	}
	reps[1].limited["ua"] = map[string]int64{}
	out.Reset()
	WriteCompareText(&out, Compare(reps[0], reps[1]), "x\x1b[1m.yaml", "y.yaml")
	terminalSafe(t, "WriteCompareText", out.String())
	if !strings.Contains(out.String(), `"\x1b]0;owned\a\x1b[2J"`) {
		t.Fatalf("the identities are not shown quoted:\n%s", out.String())
	}
	// The HTML page escapes markup in an identity.
	reps[0].Rules[0].Top[0].Identity = "<script>alert(1)</script>"
	out.Reset()
	if err := WriteHTML(&out, reps[0], "<b>t</b>"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "<script>alert") || strings.Contains(out.String(), "<b>t</b>") || !strings.Contains(out.String(), "&lt;script&gt;alert(1)") {
		t.Fatal("the HTML page does not escape an identity's markup")
	}
}

// TestShareCountsEnforcedLimitsOnly: the share column is the requests a
// rule limited; a shadow rule's would-be rejections are in the shadow
// column, not in its share, in the text and in the HTML report.
func TestShareCountsEnforcedLimitsOnly(t *testing.T) {
	var log strings.Builder
	for range 10 {
		log.WriteString(`198.51.100.1 - - [23/Nov/2026:09:00:01 +0000] "GET / HTTP/1.1" 200 1 "-" "x"` + "\n")
	}
	cfg, err := policy.Parse([]byte("rules:\n  - {name: enforced, limit: 4/h, algorithm: fixed_window}\n  - {name: watched, limit: 2/h, algorithm: fixed_window, shadow: true}\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	reps, err := Run(context.Background(), []Input{{Name: "a.log", R: strings.NewReader(log.String())}}, []*config.Config{cfg}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if w := ruleOf(t, reps[0], "watched"); w.ShadowLimited == 0 || w.Limited != 0 {
		t.Fatalf("watched: %+v", w)
	}
	var out bytes.Buffer
	WriteText(&out, reps[0])
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && f[0] == "watched" && f[3] != "0.0%" {
			t.Errorf("shadow rule's share %s, want 0.0%%:\n%s", f[3], out.String())
		}
		if len(f) > 3 && f[0] == "enforced" && f[3] != "60.0%" {
			t.Errorf("enforced rule's share %s, want 60.0%% (6 of 10):\n%s", f[3], out.String())
		}
	}
	var html bytes.Buffer
	if err := WriteHTML(&html, reps[0], "t"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(html.String(), "<td>watched</td><td>10</td><td>0</td><td>0.0%</td>") {
		t.Errorf("HTML: the shadow rule's share is not 0.0%%:\n%s", html.String())
	}
}
