// Package protect guards a service from overload and from slow or failing
// dependencies, where package weir guards it from one client at a time.
//
// A Rule combines, each optional:
//
//   - a concurrency limit: a fixed number of requests in flight, or an
//     adaptive one that learns the limit from observed latency (Vegas
//     style, with a periodic drain to re-measure the unloaded latency, as
//     BBR's ProbeRTT does), between MinConcurrency and MaxConcurrency;
//   - priority shedding: when the limit is reached, sheddable requests are
//     turned away first and critical ones last, and Reserve keeps a share
//     of the limit for critical requests alone;
//   - a circuit breaker counting the outcomes of the requests it admits:
//     slow-call ratio, error ratio and error count (Sentinel's three
//     strategies), closed → open → half-open probes → closed.
//
// A System guards the whole process: a cap on requests in flight and a
// CPU ceiling above which requests are admitted only while in flight stays
// under the measured throughput × minimum latency (Sentinel's system
// rule, after BBR).
//
// Rule.Wrap and Transport apply a rule to incoming and outgoing HTTP
// requests; package policy builds rules from the protect: and system:
// sections of weir.yaml. A rejected request gets 503 with Retry-After and a
// problem body whose error is "overloaded" or "circuit_open" and whose
// protect member names the rule.
//
// The package has no dependency beyond the standard library. Every clock
// is injectable (Config.Now), so that tests drive breakers and the
// adaptive limit deterministically.
package protect
