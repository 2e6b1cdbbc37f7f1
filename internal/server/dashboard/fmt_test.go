package dashboard

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCountedAgrees runs fmt.js's counted under Node, when there is one:
// the noun agrees with the count.
func TestCountedAgrees(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node")
	}
	mod, err := filepath.Abs("assets/fmt.js")
	if err != nil {
		t.Fatal(err)
	}
	script := `import * as f from ` + "'" + mod + "'" + `;
console.log([0, 1, 2].map((n) => f.counted(n, 'call', 'calls')).join('|'));`
	out, err := exec.Command(node, "--input-type=module", "-e", script).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "0 calls|1 call|2 calls" {
		t.Fatalf("counted: %q", got)
	}
}

// TestOneNumberFormat runs fmt.js under Node, when there is one: axis
// ticks keep the decimals their step needs (12.5 stays 12.5), and every
// figure has thousands separators and its unit.
func TestOneNumberFormat(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node")
	}
	mod, err := filepath.Abs("assets/fmt.js")
	if err != nil {
		t.Fatal(err)
	}
	script := `import * as f from ` + "'" + mod + "'" + `;
const out = [
  f.ticks([0, 2.5, 5, 7.5, 10, 12.5]).join(' '),
  f.ticks([0, 5, 10, 15]).join(' '),
  f.ticks([0, 0.25, 0.5]).join(' '),
  f.ticks([1000, 1500, 2000]).join(' '),
  f.ticks([0, 5000, 10000, 15000]).join(' '),
  f.ms(1234.5), f.ms(0.2), f.ms(3.14159), f.ms(0.05),
  f.count(12345), f.count(2500000), f.rate(1234.4), f.rate(0.44),
  f.pct(12.345), f.pct(1.25), f.pct(0.01), f.fixed(1234.5, 2),
  f.money(1234567, 'USD'), f.money(25000000, 'EUR'), f.money(495000), f.money(1), f.money(1234567890123, 'USD'), f.money(-1500000),
];
console.log(out.join('|'));`
	out, err := exec.Command(node, "--input-type=module", "-e", script).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := []string{
		"0.0 2.5 5.0 7.5 10.0 12.5",
		"0 5 10 15",
		"0.00 0.25 0.50",
		"1,000 1,500 2,000",
		"0 5K 10K 15K",
		"1,235 ms", "0.20 ms", "3.1 ms", "50 µs",
		"12,345", "2.5M", "1,234", "0.4",
		"12%", "1.3%", "<0.1%", "1,234.50",
		"1.234567 USD", "25.00 EUR", "0.495", "0.000001", "1,234,567.890123 USD", "-1.50",
	}
	if got := strings.Split(strings.TrimSpace(string(out)), "|"); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("fmt.js under Node:\n got %q\nwant %q", got, want)
	}
}
