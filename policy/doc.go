// Package policy turns HTTP requests into rate-limit decisions according to
// the rules of a weir.yaml file.
//
// A Policy is a compiled rule set over a weir.Store. For each request,
// Check runs one pipeline:
//
//  1. The deny list refuses the request (403) and the allow list exempts
//     it, before any store call. Lists hold CIDRs, matched against the
//     client IP, and identity values such as API keys.
//  2. Every rule whose match (methods, path pattern, host) fits the request
//     applies. A path is a Go 1.22 http.ServeMux pattern: "/api/login",
//     "/api/" for a subtree, "/users/{id}".
//  3. Each matched rule extracts its identity, the value it counts by: the
//     client IP (optionally grouped by prefix), a header, a cookie, a query
//     parameter, the method, the matched route pattern, a constant, or a
//     composite of several. A request without the value is skipped, denied
//     or counted by IP, as the rule's on_missing says.
//  4. A rule with tiers picks its limit by another request attribute, such
//     as the plan header X-Plan.
//  5. All enforced rules are decided at once, all or nothing: if one
//     rejects, none of the others consumes (one weir.Store.Do). Shadow
//     rules are decided separately and never block.
//  6. The Verdict keeps every rule's own result, for headers and metrics,
//     and points at the most restrictive one.
//
// The store sits behind a guard.Guard (package store/guard): a deadline
// per call and a circuit breaker.
// While the store fails, each rule follows its on_error policy: allow,
// deny, or local, an in-process limiter enforcing the limit divided by the
// number of instances.
//
// Parse and LoadFile read weir.yaml into a config.Config (package
// policy/config holds the file's types) and report every problem with its
// line and column; Watch reloads the file when it changes (and ReloadOnSignal on
// SIGHUP), keeping the old rules when the new file is bad. State keys are
// derived from the rule name and the identity only, so a reload keeps the
// counters of every rule whose limit did not change.
//
// Middleware puts a Policy in front of net/http handlers, answering with
// package httplimit's headers and rejections. After the rate limits admit a
// request, it applies the config's system section and protect rules
// (Policy.Protect, package protect): concurrency limits, priority shedding
// and circuit breakers, answering 503 when they refuse. A reload through a
// Holder hands the protect rules on, so the requests in flight stay
// counted.
//
// The engine's files: policy.go (New, the options), pipeline.go (Check),
// verdict.go (Verdict, RuleResult), ruleinfo.go (Rules), keyrequest.go
// (CheckKey, Reset), check.go (the rules' checks and compilation).
// docs/configuration.md is the reference of the file.
package policy
