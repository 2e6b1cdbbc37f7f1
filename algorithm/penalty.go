package algorithm

// Escalating penalties: `block: [1m, 10m, 1h]` with `forget_after: 24h`.
// The first rejection that starts a penalty box boxes the key for Block;
// each further one that comes within ForgetAfter of the end of the last box
// gets the next box of the list, the last one repeating. Once ForgetAfter
// has passed since the last box ended, the history is forgotten and the
// next box is Block again. Resetting the key (the admin API's unblock)
// clears the history with the box.
//
// The state is State.Strikes (how many boxes the history holds, capped at
// the list's length) and State.LastBox (the end of the last box). The Redis
// store keeps both in the penalty-box key, "<blocked_until>:<strikes>",
// which lives until ForgetAfter after the box ends (scripts/prelude.lua's
// start_box mirrors startBox).

// MaxBlockSteps is the longest list of escalating penalty boxes.
const MaxBlockSteps = 8

// Escalating reports whether p's penalty boxes grow with repeat offences.
func (p *Params) Escalating() bool { return p.ForgetAfter > 0 }

// boxLen returns the length, in µs, of the penalty box that the strike-th
// rejection of a history earns (strike counts from 1).
func (p *Params) boxLen(strike int64) int64 {
	box := p.Block
	for i := int64(0); i < strike-1 && i < int64(len(p.Escalate)) && p.Escalate[i] != 0; i++ {
		box = p.Escalate[i]
	}
	return box
}

// steps is how many boxes p's list holds.
func (p *Params) steps() int64 {
	n := int64(1)
	for _, b := range p.Escalate {
		if b == 0 {
			break
		}
		n++
	}
	return n
}

// startBox starts the penalty box a rejection at now earns, sets
// s.BlockedUntil and returns the box's length.
func startBox(p *Params, s *State, now int64) int64 {
	if !p.Escalating() {
		// A plain box forgets any history an escalating limit left on the
		// key, as the Redis store overwrites the box key.
		s.BlockedUntil, s.Strikes, s.LastBox = now+p.Block, 0, 0
		return p.Block
	}
	strikes := s.Strikes
	if strikes > 0 && now >= s.LastBox+p.ForgetAfter {
		strikes = 0 // the history is forgotten
	}
	strikes = min(strikes+1, p.steps())
	box := p.boxLen(strikes)
	s.BlockedUntil = now + box
	s.Strikes, s.LastBox = strikes, s.BlockedUntil
	return box
}

// historyLife is how much longer, in µs, an escalating penalty's history
// must be kept at now: until ForgetAfter after the last box ends.
func historyLife(p *Params, s *State, now int64) int64 {
	if !p.Escalating() || s.Strikes == 0 {
		return 0
	}
	return max(s.LastBox+p.ForgetAfter-now, 0)
}

// compilePenalty validates the block list and forget_after.
func compilePenalty(p *Params) error {
	k := p.Kind
	if p.ForgetAfter < 0 || p.ForgetAfter > MaxPeriod {
		return fieldError(k, FieldForgetAfter, Invalid, p.ForgetAfter, "forget_after must be between 0 and 10 years, got %dµs", p.ForgetAfter)
	}
	prev, ended := p.Block, false
	for i, b := range p.Escalate {
		switch {
		case b == 0:
			ended = true
			continue
		case ended:
			return fieldError(k, FieldBlock, Invalid, b, "block list: box %d (%dµs) follows an empty one", i+2, b)
		case p.Block == 0:
			return fieldError(k, FieldBlock, Invalid, b, "block list: the first box is missing")
		case b <= prev:
			return fieldError(k, FieldBlock, Invalid, b, "block list must grow, shortest first: box %d (%dµs) is not longer than box %d (%dµs)", i+2, b, i+1, prev)
		case b > MaxPeriod:
			return fieldError(k, FieldBlock, Invalid, b, "block list: box %d is over 10 years", i+2)
		}
		prev = b
	}
	if p.Escalate[0] != 0 && p.ForgetAfter == 0 {
		return fieldError(k, FieldForgetAfter, NeedsOther, 0, "a block list of several boxes needs forget_after: how long after a box its history lasts")
	}
	if p.ForgetAfter != 0 && p.Escalate[0] == 0 {
		return fieldError(k, FieldForgetAfter, NeedsOther, p.ForgetAfter, "forget_after needs a block list of several boxes, such as [1m, 10m, 1h]")
	}
	return nil
}
