package server

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/weir-dev/weir/policy/config"
)

// CheckConfig reports the rules of cfg that weir serve cannot enforce, as
// a *config.Error naming each rule and why (nil when there is none);
// file names cfg's file in the problems. policy.Parse checks the rest.
//
// Every rule weir serve loads is decided by GET /v1/auth, which is always
// served and asks every rule whose match fits the request a proxy
// describes. /v1/auth answers before the upstream runs, and no proxy
// reports the upstream's status or real cost back, so nothing settles a
// rule after the handler there: a count: rule would only peek and never
// count, and a cost: read from the request (header: or query:) would let
// the client set what it pays, 0 being free. weir serve refuses both, and
// a constant cost of 0, which takes nothing. A constant cost above 0 is
// taken whole. (POST /v1/check, /v1/reserve and Envoy name the rule and
// the cost themselves.)
func CheckConfig(cfg *config.Config, file string) error {
	var ps []config.Problem
	for i, rc := range cfg.Rules {
		path := fmt.Sprintf("rules[%d]", i)
		if rc.Count != nil {
			ps = append(ps, config.Problem{Path: path + ".count", Message: fmt.Sprintf(
				"rule %q: weir serve cannot settle count: GET /v1/auth answers before the upstream does, and no proxy reports the response's status, "+
					"so the rule would only peek and never count. Count every request instead (remove count:; block: adds a penalty box)", rc.Name)})
		}
		if rc.Cost == "" {
			continue
		}
		kind, _, _ := strings.Cut(rc.Cost, ":")
		switch {
		case kind == "header" || kind == "query":
			ps = append(ps, config.Problem{Path: path + ".cost", Message: fmt.Sprintf(
				"rule %q: weir serve cannot settle cost: %s: GET /v1/auth answers before the upstream runs, and no proxy reports the real cost, "+
					"so the client would set what it pays (0 is free). Use a constant cost, or have the service use POST /v1/reserve and /v1/settle", rc.Name, rc.Cost)})
		case isZero(rc.Cost):
			ps = append(ps, config.Problem{Path: path + ".cost", Message: fmt.Sprintf(
				"rule %q: cost %s takes nothing on GET /v1/auth, and weir serve never settles it later: the rule would never count", rc.Name, rc.Cost)})
		}
	}
	if len(ps) == 0 {
		return nil
	}
	return &config.Error{File: file, Problems: ps}
}

// isZero reports whether s is a whole number equal to 0, such as "+0".
func isZero(s string) bool {
	n, err := strconv.ParseInt(s, 10, 64)
	return err == nil && n == 0
}
