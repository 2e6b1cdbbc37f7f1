package envoyrls

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

func TestCheckJSON(t *testing.T) {
	clk := newClock()
	svc := New(integrationConfig(t), memstore.New(memstore.WithClock(clk.Now)), WithClock(clk.Now))
	ctx := context.Background()
	for _, c := range []struct {
		name, body string
		status     int
		want       string // the response body, exactly
	}{
		{"allowed", `{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"j"}]}]}`, 200,
			`{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":20,"unit":"MINUTE"},"limitRemaining":19,"durationUntilReset":"43s"}]}`},
		{"proto names and hits", `{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"j"}],"hits_addend":4}],"hits_addend":2}`, 200,
			`{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":20,"unit":"MINUTE"},"limitRemaining":15,"durationUntilReset":"43s"}]}`},
		{"camel case and check only", `{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"j"}],"hitsAddend":"0"}]}`, 200,
			`{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":20,"unit":"MINUTE"},"limitRemaining":15,"durationUntilReset":"43s"}]}`},
		{"over the limit", `{"domain":"another","hits_addend":16,"descriptors":[{"entries":[{"key":"key2","value":"j"}]},{"entries":[{"key":"nothing","value":"x"}]}]}`, 429,
			`{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":20,"unit":"MINUTE"},"limitRemaining":15,"durationUntilReset":"43s"},{"code":"OK"}]}`},
		{"unknown domain", `{"domain":"nope","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`, 200,
			`{"overallCode":"OK","statuses":[{"code":"OK"}]}`},
		{"malformed", `{"domain":`, 400, ""},
		{"unknown field", `{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"j"}]}],"hits":1}`, 400, ""},
		{"negative hits", `{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"j"}]}],"hits_addend":-1}`, 400, ""},
		{"empty domain", `{"descriptors":[{"entries":[{"key":"key2","value":"j"}]}]}`, 400, `{"error":"envoyrls: bad request: domain must not be empty"}`},
		{"no descriptors", `{"domain":"another"}`, 400, `{"error":"envoyrls: bad request: descriptors must not be empty"}`},
		{"too big", `{"domain":"` + strings.Repeat("x", MaxJSONBody) + `"}`, 413, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, status, err := svc.CheckJSON(ctx, []byte(c.body))
			if status != c.status {
				t.Fatalf("status %d, want %d (%s, %v)", status, c.status, out, err)
			}
			failed := status >= 400 && status != http.StatusTooManyRequests
			if failed != (err != nil) {
				t.Fatalf("status %d with error %v", status, err)
			}
			if err != nil && !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %v does not wrap ErrBadRequest", err)
			}
			if c.want != "" {
				// protojson varies its spacing on purpose; compare compacted.
				var got, want any
				if json.Unmarshal(out, &got) != nil || json.Unmarshal([]byte(c.want), &want) != nil {
					t.Fatalf("bad JSON %s", out)
				}
				g, _ := json.Marshal(got)
				w, _ := json.Marshal(want)
				if string(g) != string(w) {
					t.Fatalf("body\n got  %s\n want %s", g, w)
				}
			}
			if failed {
				var e struct{ Error string }
				if json.Unmarshal(out, &e) != nil || e.Error == "" {
					t.Fatalf("error body %s", out)
				}
			}
		})
	}
	// The errors name the offending field.
	for body, field := range map[string]string{
		`{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"j"}]}],"hits":1}`:         `"hits"`,
		`{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"j"}]}],"hits_addend":-1}`: "hits_addend",
		`{"domain":"another","descriptors":[{"entries":[{"key":"k","valu":"j"}]}]}`:                      `"valu"`,
	} {
		if _, _, err := svc.CheckJSON(ctx, []byte(body)); err == nil || !strings.Contains(strings.ReplaceAll(err.Error(), "hitsAddend", "hits_addend"), field) {
			t.Errorf("%s: error %v does not name %s", body, err, field)
		}
	}
}

func TestCheckJSONStoreFailure(t *testing.T) {
	svc := New(integrationConfig(t), memstore.New(), WithDecider(StoreDecider(failing{})))
	_, status, err := svc.CheckJSON(context.Background(), []byte(`{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"j"}]}]}`))
	if status != http.StatusServiceUnavailable || err == nil || errors.Is(err, ErrBadRequest) {
		t.Fatalf("status %d, err %v", status, err)
	}
}

// failing is a store that is always down.
type failing struct{}

func (failing) Take(context.Context, string, weir.Limit, int64) (weir.Result, error) {
	return weir.Result{}, fmt.Errorf("%w: connection refused", weir.ErrStore)
}
func (failing) Do(context.Context, []weir.Request, []weir.Result) error {
	return fmt.Errorf("%w: connection refused", weir.ErrStore)
}
