package server

// DemoConfig is the rule set weir serve runs with neither a config file nor
// an Envoy config: enough
// to see every part of the service at work on a laptop. Loopback is a
// trusted proxy, so an nginx or Caddy on the same host can forward client
// addresses.
const DemoConfig = `# weir's built-in demo rules (weir serve without --config).
store:
  type: memory
trusted_proxies: [127.0.0.1/32, "::1/128"]
rules:
  # Every request, 10 per second per client IP.
  - name: demo-ip
    match: { path: / }
    identity: [ip]
    limit: 10/s
    algorithm: gcra
  # Logins: 5 per 15 minutes per IP, exact; then a 15-minute penalty box.
  - name: login
    match: { methods: [POST], path: /api/login }
    identity: [ip]
    limit: 5/15m
    algorithm: sliding_log
    block: 15m
  # The API by key, with a plan picked by the X-Plan header.
  - name: api
    match: { path: /api/ }
    identity: [header:X-API-Key]
    tiers:
      by: header:X-Plan
      default: { limit: 100/m, algorithm: gcra, burst: 20 }
      pro: { limit: 5000/m, algorithm: gcra, burst: 500 }
`

// envoyOnlyConfig is the config of a server given an Envoy config and no
// config of its own: the memory store and no rules, so that only the Envoy
// config's rules are in force.
const envoyOnlyConfig = `store:
  type: memory
rules: []
`

// demo reports whether the options leave the server to run DemoConfig: no
// config, config file or Envoy config.
func (o *options) demo() bool {
	return o.cfg == nil && o.cfgPath == "" && o.envoyDir == "" && o.envoyCfg == nil
}

// RulesSource says where the rules in force come from: "config file",
// "built-in demo", "none (Envoy config only)", "api", ...
func (s *Server) RulesSource() string { return s.rules.source() }
