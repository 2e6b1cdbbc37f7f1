package dashboard

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A budget hierarchy of four levels, each a rule (weir serve's
// /v1/reserve and /v1/settle name the rule and the identity).
const spendConfig = `
store: {type: memory}
prices:
  currency: USD
  models:
    gpt-4o: {input: 2.50, output: 10}
rules:
  - {name: key-budget,  identity: ["header:X-Key"],  budget: 5 USD/day}
  - {name: user-budget, identity: ["header:X-User"], budget: 20 USD/day}
  - {name: team-budget, identity: ["header:X-Team"], budget: 200 USD/month, timezone: Europe/Paris}
  - {name: org-budget,  identity: ["header:X-Org"],  budget: 2000 USD/month}
  - {name: api, identity: ["header:X-Key"], limit: 100/m}
`

// spendSettle reserves 1 USD under rule for key and settles actual
// micro-units through weir serve's HTTP API.
func spendSettle(t *testing.T, base, rule, key string, actual int64) {
	t.Helper()
	post := func(path, body string) map[string]any {
		t.Helper()
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var d map[string]any
		if resp.StatusCode != 200 || json.Unmarshal(b, &d) != nil {
			t.Fatalf("POST %s %s: %d %s", path, body, resp.StatusCode, b)
		}
		return d
	}
	d := post("/v1/reserve", fmt.Sprintf(`{"rule":%q,"key":%q,"estimate":1000000}`, rule, key))
	post("/v1/settle", fmt.Sprintf(`{"reservation":%q,"actual":%d}`, d["reservation"], actual))
}

// TestDashboardSpendInBrowser: with the admin token the Top spenders card
// lists the heaviest identities of every level of a budget hierarchy
// (key, user, team, organisation; each a rule) in money with the
// currency, heaviest first, and Try it shows a budget key's remaining in
// money, not micro-units. Without the token the card shows no identity.
func TestDashboardSpendInBrowser(t *testing.T) {
	chromium := chromiumPath(t)
	bin := buildWeir(t)
	cfg := filepath.Join(t.TempDir(), "weir.yaml")
	if err := os.WriteFile(cfg, []byte(spendConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	base := startWeir(t, bin, cfg, e2eToken)

	// Two keys of one user, two users of one team, one team of one org.
	settled := []struct {
		key, user string
		actual    int64
	}{{"sk-alpha", "alice", 1_234_567}, {"sk-beta", "alice", 250_000}, {"sk-gamma", "bob", 2_000_001}}
	for _, s := range settled {
		spendSettle(t, base, "key-budget", s.key, s.actual)
		spendSettle(t, base, "user-budget", s.user, s.actual)
		spendSettle(t, base, "team-budget", "search", s.actual)
		spendSettle(t, base, "org-budget", "acme", s.actual)
	}
	want := map[string][][2]string{ // level → identity, amount, heaviest first
		"key-budget":  {{"sk-gamma", "2.000001 USD"}, {"sk-alpha", "1.234567 USD"}, {"sk-beta", "0.25 USD"}},
		"user-budget": {{"bob", "2.000001 USD"}, {"alice", "1.484567 USD"}},
		"team-budget": {{"search", "3.484568 USD"}},
		"org-budget":  {{"acme", "3.484568 USD"}},
	}

	b := newTab(t, chromium)
	b.viewport(1280, 900)
	if resp := b.navigate(base + "/"); resp.Status != 200 {
		t.Fatalf("GET / gave %d", resp.Status)
	}
	card := css(`[data-testid="top-spenders"]`)
	b.waitVisible(card.css("#spend-note"), actionTimeout)
	if s := b.innerText(card); strings.Contains(s, "sk-alpha") || strings.Contains(s, "acme") {
		t.Fatalf("the spend card shows an identity without the token: %s", s)
	}

	tokenInput := doc.label("Admin token", false)
	b.fill(tokenInput, e2eToken)
	b.pressEnter(tokenInput)
	b.waitVisible(css("#admin-set"), actionTimeout)
	for level, rows := range want {
		group := card.css(`.spend-group[data-rule="` + level + `"]`)
		b.waitFor("the spenders of "+level, actionTimeout, pollEvery, func() (bool, any, error) {
			n := b.count(group.css("li"))
			return n == len(rows), n, nil
		})
		var got [][2]string
		if err := b.evalJS(`W.css([document], '.spend-group[data-rule="`+level+`"] li').map((e) => [e.dataset.identity, e.querySelector('.amount').textContent])`, &got); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(rows) {
			t.Errorf("%s lists %v, want %v", level, got, rows)
		}
	}
	if s := b.innerText(card); strings.Contains(s, "1234567") {
		t.Errorf("the spend card shows micro-units: %s", s)
	}
	if b.count(card.css(`.spend-group[data-rule="api"]`)) != 0 {
		t.Error("a rule counting requests is listed as a budget level")
	}

	// Try it on a budget key: its remaining in money.
	tryIt := css(`[data-testid="try-it"]`)
	b.selectOption(tryIt.label("Rule", false), "key-budget")
	b.fill(tryIt.label("Key (identity)", false), "sk-alpha")
	b.click(tryIt.role("button", "Send check"))
	left := css("#try-summary strong.left")
	var s string
	b.waitFor("a budget's remaining in money", actionTimeout, pollEvery, func() (bool, any, error) {
		var ok bool
		var err error
		s, ok, err = b.tryInnerText(left)
		return ok && strings.Contains(s, "USD"), s, err
	})
	// 5 USD less 1.234567 settled and the check's 1 micro-unit.
	if s != "3.765432 of 5.00 USD" {
		t.Errorf("Try it on a budget key reads %q, want %q", s, "3.765432 of 5.00 USD")
	}
	b.selectOption(tryIt.label("Rule", false), "api")
	b.click(tryIt.role("button", "Send check"))
	b.waitFor("a request rule's remaining in requests", actionTimeout, pollEvery, func() (bool, any, error) {
		s, ok, err := b.tryInnerText(left)
		return ok && s == "99 of 100", s, err
	})
	if p := b.Problems(); len(p) > 0 {
		t.Errorf("problems in the page: %v", p)
	}
}
