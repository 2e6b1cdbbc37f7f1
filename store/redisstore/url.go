package redisstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// ParseURL turns a Redis address as users write it into a Config:
//
//	redis://[user:password@]host[:port][/db]     a standalone server (or one node of a cluster)
//	rediss://[user:password@]host[:port][/db]    the same over TLS
//	redis://[user:password@]host:port,host:port,...
//	                                             a Redis Cluster, given a few of its nodes
//	rediss://[user:password@]host:port,host:port,...
//	                                             the same over TLS
//	redis+sentinel://[user:password@]host:port,host:port,.../master[/db]
//	                                             Sentinels watching the master named master
//	host:port,host:port,...                      a Redis Cluster, given a few of its nodes
//	host:port                                    a standalone server
//
// The port defaults to 6379 (26379 for a Sentinel). user:password
// authenticate to the Redis servers, not to the Sentinels. Timeout, Prefix
// and the rest keep their defaults. Bad input gets an error quoting it, with
// any password replaced by "xxxxx".
func ParseURL(s string) (Config, error) {
	fail := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("redisstore: bad Redis URL %q: %s", redact(s), fmt.Sprintf(format, args...))
	}
	if strings.TrimSpace(s) == "" {
		return fail("empty")
	}
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		// host:port[,host:port...]
		var cfg Config
		for _, a := range strings.Split(s, ",") {
			addr, err := hostPort(a, "6379", true)
			if err != nil {
				return fail("%v", err)
			}
			cfg.Addrs = append(cfg.Addrs, addr)
		}
		return cfg, nil
	}
	var cfg Config
	var sentinel bool
	switch strings.ToLower(scheme) {
	case "redis":
	case "rediss":
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	case "redis+sentinel":
		sentinel = true
	default:
		return fail("unknown scheme %q (want redis, rediss or redis+sentinel)", scheme)
	}
	if strings.ContainsAny(rest, "?#") {
		return fail("query strings and fragments are not supported (percent-encode ? and # in a password)")
	}
	// The authority ends at the first '/'; userinfo ends at the last '@' in it.
	authority, path, _ := strings.Cut(rest, "/")
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		var err error
		if cfg.Username, cfg.Password, err = userInfo(authority[:i]); err != nil {
			return fail("%v", err)
		}
		authority = authority[i+1:]
	}
	if authority == "" {
		return fail("no host")
	}
	defPort := "6379"
	if sentinel {
		defPort = "26379"
	}
	hosts := strings.Split(authority, ",")
	for _, h := range hosts {
		addr, err := hostPort(h, defPort, false)
		if err != nil {
			return fail("%v", err)
		}
		cfg.Addrs = append(cfg.Addrs, addr)
	}
	if cfg.TLS != nil && len(cfg.Addrs) == 1 {
		// A cluster's nodes each have their own name: each connection
		// then checks the name it dialled.
		host, _, _ := net.SplitHostPort(cfg.Addrs[0])
		cfg.TLS.ServerName = host
	}
	var err error
	if cfg.MasterName, cfg.DB, err = masterAndDB(path, sentinel); err != nil {
		return fail("%v", err)
	}
	if len(cfg.Addrs) > 1 && !sentinel && cfg.DB != 0 {
		return fail("database %d: several hosts are a Redis Cluster, which only has database 0", cfg.DB)
	}
	return cfg, nil
}

// userInfo reads the user name and password of a URL's "user:password"
// (percent-encoded). Its errors never quote the password.
func userInfo(info string) (user, pass string, err error) {
	user, pass, hasPass := strings.Cut(info, ":")
	if !hasPass {
		// redis://secret@host: a lone value is the password, as
		// redis-cli -u reads it (requirepass without ACL users).
		user, pass = "", user
	}
	if user, err = url.PathUnescape(user); err != nil {
		return "", "", fmt.Errorf("user name: %w", err)
	}
	if pass, err = url.PathUnescape(pass); err != nil {
		return "", "", errors.New("the password has a bad %-escape") // never echo it
	}
	return user, pass, nil
}

// masterAndDB reads a URL's path (after the authority's '/'): the master
// name first for a Sentinel URL, then an optional database number.
func masterAndDB(path string, sentinel bool) (master string, db int, err error) {
	segs := []string{}
	if path != "" {
		segs = strings.Split(path, "/")
	}
	if sentinel {
		if len(segs) == 0 || segs[0] == "" {
			return "", 0, errors.New("no master name: want redis+sentinel://host:port,host:port/mastername[/db]")
		}
		if master, err = url.PathUnescape(segs[0]); err != nil {
			return "", 0, fmt.Errorf("master name: %w", err)
		}
		segs = segs[1:]
	}
	switch {
	case len(segs) == 0 || len(segs) == 1 && segs[0] == "":
	case len(segs) == 1:
		db, err = strconv.Atoi(segs[0])
		if err != nil || db < 0 || segs[0][0] == '+' {
			return "", 0, fmt.Errorf("database %q is not a non-negative whole number", segs[0])
		}
	default:
		return "", 0, fmt.Errorf("unexpected path %q", "/"+path)
	}
	return master, db, nil
}

// hostPort checks one "host[:port]" and adds the default port if missing.
// A bare address list requires the port.
func hostPort(h, defPort string, needPort bool) (string, error) {
	h = strings.TrimSpace(h)
	if h == "" {
		return "", fmt.Errorf("empty host")
	}
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		if needPort || strings.Count(h, ":") > 1 && !strings.HasPrefix(h, "[") {
			return "", fmt.Errorf("address %q: want host:port", h)
		}
		host, port = strings.Trim(h, "[]"), defPort
	}
	if host == "" {
		return "", fmt.Errorf("address %q has no host", h)
	}
	if strings.ContainsAny(host, "/@ ") {
		return "", fmt.Errorf("address %q: bad host %q", h, host)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("address %q: bad port %q", h, port)
	}
	return net.JoinHostPort(host, port), nil
}

// redact hides the password of a URL's userinfo: everything between the
// scheme and the last '@' of the authority after the first ':'.
func redact(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	authority, path, hasPath := strings.Cut(rest, "/")
	at := strings.LastIndexByte(authority, '@')
	if at < 0 {
		return s
	}
	user, _, hasPass := strings.Cut(authority[:at], ":")
	info := "xxxxx" // a lone value is a password
	if hasPass {
		info = user + ":xxxxx"
	}
	out := scheme + "://" + info + authority[at:]
	if hasPath {
		out += "/" + path
	}
	return out
}
