package envoyrls

import (
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// CodecOption is the gRPC server option that makes Codec the server's
// codec.
func CodecOption() grpc.ServerOption { return grpc.ForceServerCodecV2(Codec()) }

// Codec returns a gRPC codec that decodes the rate limit
// service's requests and encodes its responses without protobuf's
// reflection, with protowire: requests in a few allocations
// (decodeRequest), responses of statuses alone (plainResponse) into the
// bytes proto.Marshal writes. Every other message, any request
// decodeRequest leaves alone and any response with headers, metadata, a
// body or a quota go through gRPC's standard proto codec, so each message
// decodes exactly as proto.Unmarshal decodes it.
func Codec() encoding.CodecV2 { return rlsCodec{std: encoding.GetCodecV2("proto")} }

// rlsCodec is gRPC's "proto" codec with a fast path for RateLimitRequest
// and RateLimitResponse.
type rlsCodec struct{ std encoding.CodecV2 }

func (c rlsCodec) Name() string { return "proto" }

func (c rlsCodec) Marshal(v any) (mem.BufferSlice, error) {
	resp, ok := v.(*rlspb.RateLimitResponse)
	if !ok || !plainResponse(resp) {
		return c.std.Marshal(v)
	}
	size := sizeResponse(resp)
	if size <= len(smallResponse{}.inline) {
		// The slice, its one buffer and the bytes in one allocation.
		r := &smallResponse{}
		r.buf = appendResponse(r.inline[:0], resp)
		r.bufs[0] = &r.buf
		return r.bufs[:], nil
	}
	if mem.IsBelowBufferPoolingThreshold(size) {
		return mem.BufferSlice{mem.SliceBuffer(appendResponse(make([]byte, 0, size), resp))}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	*buf = appendResponse((*buf)[:0], resp)
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// smallResponse is an encoded response of up to 160 bytes, five
// descriptors' statuses or so.
type smallResponse struct {
	bufs   [1]mem.Buffer
	buf    mem.SliceBuffer
	inline [160]byte
}

func (c rlsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*rlspb.RateLimitRequest)
	if !ok {
		return c.std.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if decodeRequest(b, req) {
		return nil
	}
	proto.Reset(req)
	return proto.Unmarshal(b, req)
}

// decodeRequest decodes b into m, which must be empty, as proto.Unmarshal
// would, and reports whether it did. It decodes what Envoy sends: the
// domain, the descriptors with their entries, hits_addend and
// is_negative_hits, the call's hits_addend, each field in any order and
// number of times. It leaves to proto.Unmarshal (returning false, m in any
// state) whatever else: a limit override, unknown fields, a field of
// another wire type than its own, a wrapper seen twice (proto merges
// them), invalid UTF-8, malformed input, and more descriptors or entries
// than a call may have (MaxDescriptors, MaxEntries: the call is refused
// after decoding). Lengths are checked against b before anything is
// allocated, so the input's size bounds the work and the memory.
func decodeRequest(b []byte, m *rlspb.RateLimitRequest) bool {
	// First pass: count the descriptors and their entries, so that the
	// call's descriptors, entries and the slices of pointers to them take
	// four allocations, whatever their number.
	n, total := 0, 0
	for rest := b; len(rest) > 0; {
		num, typ, l := protowire.ConsumeTag(rest)
		if l < 0 {
			return false
		}
		rest = rest[l:]
		if l = protowire.ConsumeFieldValue(num, typ, rest); l < 0 {
			return false
		}
		if num == 2 && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(rest)
			k, ok := countEntries(v)
			if !ok {
				return false
			}
			n, total = n+1, total+k
		}
		rest = rest[l:]
	}
	if n > MaxDescriptors {
		return false // refused by checkBounds; decoded as before, piece by piece
	}
	var descs []rlcommon.RateLimitDescriptor
	var es entryPool
	if n > 0 {
		descs = make([]rlcommon.RateLimitDescriptor, n)
		m.Descriptors = make([]*rlcommon.RateLimitDescriptor, 0, n)
	}
	if total > 0 {
		es.vals = make([]rlcommon.RateLimitDescriptor_Entry, total)
		es.ptrs = make([]*rlcommon.RateLimitDescriptor_Entry, total)
	}
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		b = b[l:] // l > 0: the first pass read every tag
		switch {
		case num == 1 && typ == protowire.BytesType:
			s, ok := consumeString(&b)
			if !ok {
				return false
			}
			m.Domain = s
		case num == 2 && typ == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			b = b[l:]
			d := &descs[len(m.Descriptors)]
			if !decodeDescriptor(v, d, &es) {
				return false
			}
			m.Descriptors = append(m.Descriptors, d)
		case num == 3 && typ == protowire.VarintType:
			v, l := protowire.ConsumeVarint(b)
			b = b[l:]
			m.HitsAddend = uint32(v)
		default:
			return false
		}
	}
	return true
}

// entryPool holds a call's descriptor entries, allocated at once: each
// descriptor takes the next ones.
type entryPool struct {
	vals []rlcommon.RateLimitDescriptor_Entry
	ptrs []*rlcommon.RateLimitDescriptor_Entry
	next int
}

// countEntries counts a descriptor's entries; false: malformed, or more
// than MaxEntries (the call is refused after decoding).
func countEntries(b []byte) (int, bool) {
	n := 0
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return 0, false
		}
		b = b[l:]
		if num == 1 && typ == protowire.BytesType {
			n++
		}
		if l = protowire.ConsumeFieldValue(num, typ, b); l < 0 {
			return 0, false
		}
		b = b[l:]
	}
	return n, n <= MaxEntries
}

// decodeDescriptor decodes one RateLimitDescriptor, whose input
// countEntries has read, for decodeRequest.
func decodeDescriptor(b []byte, d *rlcommon.RateLimitDescriptor, es *entryPool) bool {
	first := es.next
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		b = b[l:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			b = b[l:]
			e := &es.vals[es.next]
			if !decodeEntry(v, e) {
				return false
			}
			es.ptrs[es.next] = e
			es.next++
		case num == 3 && typ == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			if d.HitsAddend != nil {
				return false // a second wrapper merges into the first: proto's job
			}
			b = b[l:]
			h := &wrapperspb.UInt64Value{}
			for len(v) > 0 {
				num, typ, l := protowire.ConsumeTag(v)
				if l < 0 || num != 1 || typ != protowire.VarintType {
					return false
				}
				v = v[l:]
				x, l := protowire.ConsumeVarint(v)
				if l < 0 {
					return false
				}
				v = v[l:]
				h.Value = x
			}
			d.HitsAddend = h
		case num == 4 && typ == protowire.VarintType:
			v, l := protowire.ConsumeVarint(b)
			b = b[l:]
			d.IsNegativeHits = v != 0
		default:
			return false
		}
	}
	if es.next > first {
		// Capacity clipped: an append to one descriptor's entries never
		// writes over the next one's.
		d.Entries = es.ptrs[first:es.next:es.next]
	}
	return true
}

// decodeEntry decodes one descriptor entry for decodeDescriptor.
func decodeEntry(b []byte, e *rlcommon.RateLimitDescriptor_Entry) bool {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 || typ != protowire.BytesType || num != 1 && num != 2 {
			return false
		}
		b = b[l:]
		s, ok := consumeString(&b)
		if !ok {
			return false
		}
		if num == 1 {
			e.Key = s
		} else {
			e.Value = s
		}
	}
	return true
}

// consumeString reads a length-delimited string off *b, refusing invalid
// UTF-8 as proto3 does.
func consumeString(b *[]byte) (string, bool) {
	v, l := protowire.ConsumeBytes(*b)
	if l < 0 || !utf8.Valid(v) {
		return "", false
	}
	*b = (*b)[l:]
	return string(v), true
}

// plainResponse reports a response appendResponse encodes: an overall code
// and statuses of a code, a current limit, the remaining count and a
// duration, as ShouldRateLimit answers without headers, metadata or quotas.
func plainResponse(r *rlspb.RateLimitResponse) bool {
	if r == nil || len(r.ResponseHeadersToAdd) > 0 || len(r.RequestHeadersToAdd) > 0 || len(r.RawBody) > 0 || r.DynamicMetadata != nil || r.Quota != nil {
		return false
	}
	for _, st := range r.Statuses {
		if st == nil || st.Quota != nil || st.CurrentLimit != nil && !utf8.ValidString(st.CurrentLimit.Name) {
			return false // proto.Marshal refuses invalid UTF-8: its error, not ours
		}
	}
	return true
}

// Field numbers and wire types of the response, as in rls.proto.
const (
	respOverallCode    = 1
	respStatuses       = 2
	stCode             = 1
	stCurrentLimit     = 2
	stLimitRemaining   = 3
	stDurationUntilRst = 4
	rlRequestsPerUnit  = 1
	rlUnit             = 2
	rlName             = 3
	rlUnitMultiplier   = 4
)

func sizeVarintField(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func sizeBytesField(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func sizeLimit(l *rlspb.RateLimitResponse_RateLimit) int {
	n := sizeVarintField(rlRequestsPerUnit, uint64(l.RequestsPerUnit)) + sizeVarintField(rlUnit, uint64(l.Unit))
	if l.Name != "" {
		n += sizeBytesField(rlName, len(l.Name))
	}
	if m := l.UnitMultiplier; m != nil {
		n += sizeBytesField(rlUnitMultiplier, sizeVarintField(1, uint64(m.Value)))
	}
	return n
}

func sizeDuration(d *durationpb.Duration) int {
	return sizeVarintField(1, uint64(d.Seconds)) + sizeVarintField(2, uint64(int64(d.Nanos)))
}

func sizeStatus(st *rlspb.RateLimitResponse_DescriptorStatus) int {
	n := sizeVarintField(stCode, uint64(st.Code)) + sizeVarintField(stLimitRemaining, uint64(st.LimitRemaining))
	if st.CurrentLimit != nil {
		n += sizeBytesField(stCurrentLimit, sizeLimit(st.CurrentLimit))
	}
	if st.DurationUntilReset != nil {
		n += sizeBytesField(stDurationUntilRst, sizeDuration(st.DurationUntilReset))
	}
	return n
}

func sizeResponse(r *rlspb.RateLimitResponse) int {
	n := sizeVarintField(respOverallCode, uint64(r.OverallCode))
	for _, st := range r.Statuses {
		n += sizeBytesField(respStatuses, sizeStatus(st))
	}
	return n
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// appendResponse appends r's encoding, a plainResponse, to b: the bytes
// proto.Marshal writes (fields in number order, zero values left out; an
// enum or int32 below zero as ten bytes).
func appendResponse(b []byte, r *rlspb.RateLimitResponse) []byte {
	b = appendVarintField(b, respOverallCode, uint64(r.OverallCode))
	for _, st := range r.Statuses {
		b = protowire.AppendTag(b, respStatuses, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeStatus(st)))
		b = appendVarintField(b, stCode, uint64(st.Code))
		if l := st.CurrentLimit; l != nil {
			b = protowire.AppendTag(b, stCurrentLimit, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(sizeLimit(l)))
			b = appendVarintField(b, rlRequestsPerUnit, uint64(l.RequestsPerUnit))
			b = appendVarintField(b, rlUnit, uint64(l.Unit))
			if l.Name != "" {
				b = protowire.AppendTag(b, rlName, protowire.BytesType)
				b = protowire.AppendString(b, l.Name)
			}
			if m := l.UnitMultiplier; m != nil {
				b = protowire.AppendTag(b, rlUnitMultiplier, protowire.BytesType)
				b = protowire.AppendVarint(b, uint64(sizeVarintField(1, uint64(m.Value))))
				b = appendVarintField(b, 1, uint64(m.Value))
			}
		}
		b = appendVarintField(b, stLimitRemaining, uint64(st.LimitRemaining))
		if d := st.DurationUntilReset; d != nil {
			b = protowire.AppendTag(b, stDurationUntilRst, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(sizeDuration(d)))
			b = appendVarintField(b, 1, uint64(d.Seconds))
			b = appendVarintField(b, 2, uint64(int64(d.Nanos)))
		}
	}
	return b
}
