package replay

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// maxTextMinutes is how many minutes the terminal timeline prints; the
// rest are in --json and --html.
const maxTextMinutes = 60

// WriteText writes the terminal report: the input, what could not be
// evaluated, one block per rule, and the per-minute timeline of limited
// requests.
func WriteText(w io.Writer, r *Report) {
	fmt.Fprintf(w, "%s (%s), %s to %s\n", plural(r.Lines, "line"), clean(r.Format), clean(orDash(r.From)), clean(orDash(r.To)))
	if r.Skipped > 0 {
		fmt.Fprintf(w, "skipped %s that could not be read: %s\n", plural(r.Skipped, "line"), lineList(r.SkippedLines, true))
	}
	if r.Late > 0 {
		fmt.Fprintf(w, "%s out of order by more than the window, decided late: %s\n", plural(r.Late, "line"), lineList(r.LateLines, false))
	}
	if r.AllowListed > 0 || r.DenyListed > 0 {
		fmt.Fprintf(w, "allow list: %s passed; deny list: %s refused\n", plural(r.AllowListed, "request"), num64(r.DenyListed))
	}
	for _, n := range r.NotEvaluated {
		fmt.Fprintf(w, "NOT EVALUATED %s: %s\n", clean(n.Rule), clean(n.Reason))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", clean(n))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rule\tmatched\tlimited\tshare\tshadow\tidentities\tlimited ids\t")
	for _, rr := range r.Rules {
		approx := ""
		if rr.Approximate {
			approx = "~"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s%s\t%s%s\t\n", clean(rr.Name), num64(rr.Matched), num64(rr.Limited),
			share(rr.Limited, rr.Matched), num64(rr.ShadowLimited), approx, num64(rr.Identities), approx, num64(rr.LimitedIdentities))
	}
	tw.Flush()
	for _, rr := range r.Rules {
		if len(rr.Top) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s: top limited\n", clean(rr.Name))
		for _, t := range rr.Top {
			fmt.Fprintf(w, "  %8s  %s\n", num64(t.Limited), clean(t.Identity))
		}
	}
	writeTimeline(w, r.Timeline)
}

// writeTimeline prints the minutes with limited requests, with bars.
func writeTimeline(w io.Writer, tl []Minute) {
	var rows []Minute
	var peak int64
	for _, m := range tl {
		if m.Limited+m.ShadowLimited > 0 {
			rows = append(rows, m)
			peak = max(peak, m.Limited+m.ShadowLimited)
		}
	}
	fmt.Fprintln(w, "\nlimited per minute (# enforced, + shadow):")
	if len(rows) == 0 {
		fmt.Fprintln(w, "  none")
		return
	}
	for i, m := range rows {
		if i == maxTextMinutes {
			fmt.Fprintf(w, "  … %s more with limited requests (--json or --html lists them all)\n", plural(int64(len(rows)-i), "minute"))
			break
		}
		const width = 40
		a := int((m.Limited*width + peak - 1) / peak)
		b := int(((m.Limited+m.ShadowLimited)*width+peak-1)/peak) - a
		fmt.Fprintf(w, "  %s %8s/%-8s %s%s\n", clean(strings.TrimSuffix(m.Minute, ":00Z")), num64(m.Limited+m.ShadowLimited), num64(m.Requests), strings.Repeat("#", a), strings.Repeat("+", b))
	}
}

func lineList(ls []LineRef, why bool) string {
	var parts []string
	multi := false
	for _, l := range ls {
		multi = multi || l.Input != ls[0].Input
	}
	for _, l := range ls {
		s := strconv.FormatInt(l.Line, 10)
		if multi {
			s = clean(l.Input) + ":" + s
		}
		if why && l.Error != "" {
			s += " (" + clean(l.Error) + ")"
		}
		parts = append(parts, s)
	}
	if len(parts) == 1 {
		return "line " + parts[0]
	}
	return "lines " + strings.Join(parts, ", ")
}

// plural renders n things.
func plural(n int64, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return num64(n) + " " + thing + "s"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// share renders n/of as a percentage.
func share(n, of int64) string {
	if of == 0 {
		return "-"
	}
	return strconv.FormatFloat(100*float64(n)/float64(of), 'f', 1, 64) + "%"
}

// num64 renders n with thousands separators.
func num64(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// clean returns s for a terminal: as it is when every character prints,
// else quoted as a Go string, so that a control character, an escape
// sequence or a bidirectional override taken from a log shows as an
// escape (\x1b, \u202e) and is never sent to the terminal.
func clean(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
