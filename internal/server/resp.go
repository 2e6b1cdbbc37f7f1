package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/resp"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
)

// respNamespace is the rule part of the store keys of CL.THROTTLE and
// GCRA. weir.Key escapes its ':' as "%3A", which no rule name can give
// (rule names hold letters, digits, '.', '_' and '-'), so these keys never
// meet a rule's.
const respNamespace = "resp:gcra"

// WithRESPAddr sets the Redis-protocol listener's address, overriding
// server.resp.addr; "" or "off" serves none.
func WithRESPAddr(addr string) Option { return func(o *options) { o.respAddr = &addr } }

// WithRESPToken sets the token RESP clients must give with AUTH,
// overriding server.resp.token.
func WithRESPToken(token string) Option { return func(o *options) { o.respToken = &token } }

// RESPAddr returns the address the Redis-protocol listener will listen
// on, "" for none (the default).
func (s *Server) RESPAddr() string {
	a := s.base.Load().Server.RESP.Addr
	if s.o.respAddr != nil {
		a = *s.o.respAddr
	}
	if a == config.GRPCOff {
		return ""
	}
	return a
}

// respServer builds the RESP server from the config and options.
func (s *Server) respServer() (*resp.Server, error) {
	rc := s.base.Load().Server.RESP
	token := rc.Token
	if s.o.respToken != nil {
		token = *s.o.respToken
	}
	cfg := resp.Config{Token: normalizeAdminToken(token), Logger: s.log, InTurn: s.mem}
	useTLS := s.tls != nil
	if rc.TLS != nil {
		useTLS = *rc.TLS
	}
	if useTLS {
		if s.tls == nil {
			return nil, errors.New("server: server.resp.tls is true but no certificate is configured (server.tls or --tls-cert)")
		}
		cfg.TLS = s.tls.ServerConfig(nil)
	}
	return resp.NewServer(respBackend{s}, cfg), nil
}

// ServeRESP serves the Redis protocol on l until the server shuts down
// (Shutdown drains it with the other listeners). ListenAndServe calls it
// when RESPAddr is set; call it before Serve.
func (s *Server) ServeRESP(l net.Listener) error {
	rs, err := s.respServer()
	if err != nil {
		l.Close()
		return err
	}
	s.mu.Lock()
	s.respSrv = rs
	s.mu.Unlock()
	go func() {
		if err := rs.Serve(l); err != nil && !errors.Is(err, resp.ErrServerClosed) {
			s.log.Error("weir: RESP listener failed", "err", err)
		}
	}()
	return nil
}

// shutdownRESP drains the RESP listener, if any.
func (s *Server) shutdownRESP(ctx context.Context) error {
	s.mu.Lock()
	rs := s.respSrv
	s.mu.Unlock()
	if rs == nil {
		return nil
	}
	if err := rs.Shutdown(ctx); err != nil {
		return fmt.Errorf("server: RESP shutdown: %w", err)
	}
	return nil
}

// respBackend decides the RESP commands: CL.THROTTLE and GCRA on the
// store behind the guard (deadline, breaker, deny cache) in their own
// namespace, WEIR.CHECK as POST /v1/check does.
type respBackend struct{ s *Server }

// Take implements resp.Backend.
func (b respBackend) Take(ctx context.Context, command, key string, l weir.Limit, n int64) (weir.Result, error) {
	s := b.s
	start := time.Now()
	res, err := s.stack.Take(ctx, weir.Key(respNamespace, key), l, n)
	lat := time.Since(start)
	switch {
	case err != nil:
		s.metrics.store(lat, storeFailed(ctx, err))
	case n == 0:
		s.metrics.store(lat, false) // a peek decides nothing
	case res.Allowed:
		s.count(command, resultAllowed, outAllowed, "", false, s.now(), lat, false)
	default:
		s.count(command, resultLimited, outLimited, "", false, s.now(), lat, false)
		s.tops.add(command, key) // the hot keys of /v1/top and the dashboard
	}
	return res, err
}

// Check implements resp.Backend.
func (b respBackend) Check(ctx context.Context, rule, key string, hits int64) (resp.CheckResult, error) {
	p := b.s.holder.Load()
	rr, err := p.CheckKey(ctx, policy.KeyRequest{Rule: rule, Key: key, N: hits})
	if err != nil {
		return resp.CheckResult{}, ruleError(p, rule, err)
	}
	return checkResult(decisionOf(rr.Rule, rr.Result, rr.Shadow)), nil
}

// Reserve implements resp.Backend with POST /v1/reserve's decision.
func (b respBackend) Reserve(ctx context.Context, rule, tier, key string, estimate int64) (resp.ReserveResult, error) {
	p := b.s.holder.Load()
	rr, id, err := b.s.reserve(ctx, p, rule, tier, key, estimate)
	switch {
	case errors.Is(err, errTooManyReservations):
		return resp.ReserveResult{}, fmt.Errorf("%v; settle some first", err)
	case err != nil:
		return resp.ReserveResult{}, ruleError(p, rule, err)
	}
	out := resp.ReserveResult{CheckResult: checkResult(decisionOf(rr.Rule, rr.Result, rr.Shadow))}
	if id != "" {
		out.Reservation, out.ExpiresIn = id, ReservationTTL
	}
	return out, nil
}

// Settle implements resp.Backend with POST /v1/settle's decision.
func (b respBackend) Settle(ctx context.Context, id string, actual int64) (resp.CheckResult, error) {
	if actual < 0 || actual > algorithm.MaxDebt {
		return resp.CheckResult{}, fmt.Errorf("actual is %d; it must be 0 to %d", actual, int64(algorithm.MaxDebt))
	}
	p := b.s.holder.Load()
	rule, rr, err := b.s.settle(ctx, p, id, actual)
	var kept *keptError
	switch {
	case errors.Is(err, errUnknownReservation):
		return resp.CheckResult{}, fmt.Errorf("reservation %q is unknown, expired or already settled", id)
	case errors.As(err, &kept):
		return resp.CheckResult{}, kept
	case err != nil:
		return resp.CheckResult{}, ruleError(p, rule, err)
	}
	return checkResult(decisionOf(rr.Rule, rr.Result, rr.Shadow)), nil
}

// checkResult is d for the RESP replies.
func checkResult(d CheckAnswer) resp.CheckResult {
	return resp.CheckResult{
		Allowed:    d.Allowed,
		Limit:      d.Limit,
		Remaining:  d.Remaining,
		RetryAfter: time.Duration(d.RetryAfterMS) * time.Millisecond,
		ResetAfter: time.Duration(d.ResetAfterMS) * time.Millisecond,
	}
}
