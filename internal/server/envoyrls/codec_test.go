package envoyrls

import (
	"bytes"
	"math"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// envoyRequests are requests as Envoy sends them: the fast path's inputs.
func envoyRequests() []*rlspb.RateLimitRequest {
	return []*rlspb.RateLimitRequest{
		{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{desc("client", "10.0.0.1")}},
		{Domain: "rl", HitsAddend: 7, Descriptors: []*rlcommon.RateLimitDescriptor{desc("foo", "x", "bar", "banned"), desc("qux", "")}},
		{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{desc("client", "a"), desc("client2", "b"), desc("client3", "c"), desc("client4", "d"), desc("client5", "e")}},
		{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{withHits(desc("tokens", "k"), 1234), withHits(desc("z", "é"), 0)}},
		{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k"}}, IsNegativeHits: true}}},
		{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{{}}},
		{Domain: "rl"},
		{},
	}
}

// decodeBoth decodes b with proto.Unmarshal and with the codec, and fails
// unless both refuse it or both give equal messages. It returns whether
// the fast path decoded it.
func decodeBoth(t *testing.T, b []byte) bool {
	t.Helper()
	var want rlspb.RateLimitRequest
	wantErr := proto.Unmarshal(b, &want)

	var fast rlspb.RateLimitRequest
	ok := decodeRequest(b, &fast)
	if ok && wantErr != nil {
		t.Fatalf("decodeRequest(%x) decoded what proto.Unmarshal refuses (%v): %v", b, wantErr, &fast)
	}
	if ok && !proto.Equal(&want, &fast) {
		t.Fatalf("decodeRequest(%x) = %v, proto.Unmarshal = %v", b, &fast, &want)
	}

	var got rlspb.RateLimitRequest
	err := rlsCodec{std: encoding.GetCodecV2("proto")}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("codec on %x: error %v, proto.Unmarshal's %v", b, err, wantErr)
	}
	if err == nil && !proto.Equal(&want, &got) {
		t.Fatalf("codec on %x = %v, proto.Unmarshal = %v", b, &got, &want)
	}
	return ok
}

// Requests as Envoy sends them take the fast path and decode as
// proto.Unmarshal decodes them.
func TestCodecDecodesEnvoyRequests(t *testing.T) {
	for _, r := range envoyRequests() {
		if !decodeBoth(t, marshal(t, r)) {
			t.Errorf("decodeRequest left %v to proto.Unmarshal", r)
		}
	}
}

// Everything else decodes as proto.Unmarshal decodes it (or is refused as
// it refuses it): unknown fields, repeated singular fields, wrong wire
// types, invalid UTF-8, overrides, truncation, over the call's bounds.
func TestCodecMatchesProtoOnOddInput(t *testing.T) {
	base := marshal(t, envoyRequests()[1])
	tag := func(num protowire.Number, typ protowire.Type) []byte { return protowire.AppendTag(nil, num, typ) }
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	str := func(num protowire.Number, s string) []byte {
		return protowire.AppendString(tag(num, protowire.BytesType), s)
	}
	msg := func(num protowire.Number, bs ...[]byte) []byte {
		return protowire.AppendBytes(tag(num, protowire.BytesType), cat(bs...))
	}
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(tag(num, protowire.VarintType), v)
	}
	entry := msg(1, str(1, "k"), str(2, "v"))
	many := func(n int, b []byte) []byte { return bytes.Repeat(b, n) }
	cases := map[string][]byte{
		"unknown field":               cat(base, str(9, "x")),
		"unknown field in descriptor": cat(str(1, "rl"), msg(2, entry, varint(7, 1))),
		"unknown field in entry":      cat(str(1, "rl"), msg(2, msg(1, str(1, "k"), str(3, "x")))),
		"unknown field in wrapper":    cat(str(1, "rl"), msg(2, entry, msg(3, varint(1, 5), varint(2, 1)))),
		"domain twice":                cat(str(1, "a"), str(1, "b"), msg(2, entry)),
		"hits twice":                  cat(str(1, "rl"), varint(3, 5), varint(3, 9), msg(2, entry)),
		"key twice":                   cat(str(1, "rl"), msg(2, msg(1, str(1, "a"), str(1, "b"), str(2, "v")))),
		"wrapper twice":               cat(str(1, "rl"), msg(2, entry, msg(3, varint(1, 5)), msg(3, varint(1, 7)))),
		"empty wrapper":               cat(str(1, "rl"), msg(2, entry, msg(3))),
		"negative as 2":               cat(str(1, "rl"), msg(2, entry, varint(4, 2))),
		"negative twice":              cat(str(1, "rl"), msg(2, entry, varint(4, 2), varint(4, 0))),
		"hits over uint32":            cat(str(1, "rl"), varint(3, 1<<40+3), msg(2, entry)),
		"overlong varint":             cat(str(1, "rl"), []byte{0x18, 0x85, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, msg(2, entry)),
		"domain as varint":            cat(varint(1, 3), msg(2, entry)),
		"descriptors as varint":       cat(str(1, "rl"), varint(2, 1)),
		"hits as bytes":               cat(str(1, "rl"), str(3, "x"), msg(2, entry)),
		"key as varint":               cat(str(1, "rl"), msg(2, msg(1, varint(1, 1)))),
		"wrapper value as bytes":      cat(str(1, "rl"), msg(2, entry, msg(3, str(1, "x")))),
		"invalid UTF-8 domain":        cat(str(1, "r\xffl"), msg(2, entry)),
		"invalid UTF-8 value":         cat(str(1, "rl"), msg(2, msg(1, str(1, "k"), str(2, "\xc3")))),
		"override":                    marshal(t, &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{withOverride(desc("k", "v"), 3, typev3.RateLimitUnit_HOUR, 2)}}),
		"group":                       cat(str(1, "rl"), tag(5, protowire.StartGroupType), tag(5, protowire.EndGroupType)),
		"field number 0":              cat([]byte{0x02, 0x00}, str(1, "rl")),
		"truncated":                   base[:len(base)-1],
		"length past the end":         cat(str(1, "rl"), []byte{0x12, 0x7f, 0x0a}),
		"too many descriptors":        cat(str(1, "rl"), many(MaxDescriptors+1, msg(2, entry))),
		"as many as allowed":          cat(str(1, "rl"), many(MaxDescriptors, msg(2, many(MaxEntries, entry)))),
		"too many entries":            cat(str(1, "rl"), msg(2, many(MaxEntries+1, entry))),
		"empty":                       nil,
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) { decodeBoth(t, b) })
	}
}

// Any bytes decode through the codec as proto.Unmarshal decodes them.
func FuzzCodecDecode(f *testing.F) {
	for _, r := range envoyRequests() {
		f.Add(marshal(f, r))
	}
	f.Add(marshal(f, &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{withOverride(desc("k", "v"), 3, typev3.RateLimitUnit_HOUR, 2)}}))
	f.Add([]byte{0x0a, 0x02, 'r', 'l', 0x12, 0x05, 0x1a, 0x03, 0x08, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) { decodeBoth(t, b) })
}

// encodeBoth checks the codec's encoding of r against proto.Marshal's:
// the same bytes (proto.Marshal writes fields in number order), or the
// standard codec's when r is not a plain response.
func encodeBoth(t *testing.T, r *rlspb.RateLimitResponse) {
	t.Helper()
	want, wantErr := proto.Marshal(r)
	got, err := rlsCodec{std: encoding.GetCodecV2("proto")}.Marshal(r)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("codec on %v: error %v, proto.Marshal's %v", r, err, wantErr)
	}
	if err != nil {
		return
	}
	b := got.Materialize()
	got.Free()
	if !bytes.Equal(b, want) {
		t.Fatalf("codec on %v:\n got %x\nwant %x", r, b, want)
	}
}

func plainStatus(code int32, rpu uint32, unit int32, name string, mult uint32, hasMult bool, remaining uint32, secs int64, nanos int32, hasDur bool) *rlspb.RateLimitResponse_DescriptorStatus {
	st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_Code(code), LimitRemaining: remaining}
	if rpu != 0 || unit != 0 || name != "" || hasMult {
		st.CurrentLimit = &rlspb.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: rlspb.RateLimitResponse_RateLimit_Unit(unit), Name: name}
		if hasMult {
			st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(mult)
		}
	}
	if hasDur {
		st.DurationUntilReset = &durationpb.Duration{Seconds: secs, Nanos: nanos}
	}
	return st
}

// Responses encode to the bytes proto.Marshal writes; those with headers,
// metadata or a quota, or a name that is not UTF-8, go to proto.Marshal.
func TestCodecEncodesAsProto(t *testing.T) {
	over := rlspb.RateLimitResponse_OVER_LIMIT
	cases := []*rlspb.RateLimitResponse{
		{},
		{OverallCode: rlspb.RateLimitResponse_OK, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{{Code: rlspb.RateLimitResponse_OK}}},
		{OverallCode: over, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{
			plainStatus(int32(over), 100, 1, "", 0, false, 0, 1, 0, true),
			plainStatus(1, 5, 3, "per-user", 2, true, 4, 59, 999_999_999, true),
			plainStatus(1, 0, 0, "", 0, true, math.MaxUint32, 0, 0, true),
			plainStatus(-1, math.MaxUint32, -7, strings.Repeat("n", 300), math.MaxUint32, true, 1, -5, -3, true),
		}},
		{Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{plainStatus(1, 1, 1, "bad \xff name", 0, false, 0, 0, 0, false)}},
		{Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{{Quota: &rlspb.RateLimitResponse_Quota{Requests: 3}}}},
		{OverallCode: over, ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "x-ratelimit-limit", Value: "5"}}},
		{DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStringValue("b")}}},
		{RawBody: []byte("body")},
	}
	for _, r := range cases {
		encodeBoth(t, r)
	}
	// Past gRPC's pooling threshold: the pooled buffer's path.
	big := &rlspb.RateLimitResponse{OverallCode: over}
	for i := 0; i < MaxDescriptors; i++ {
		big.Statuses = append(big.Statuses, plainStatus(2, uint32(i), 4, strings.Repeat("x", 200), 3, true, 9, 60, 5, true))
	}
	encodeBoth(t, big)
}

// Any plain response encodes to the bytes proto.Marshal writes.
func FuzzCodecEncode(f *testing.F) {
	f.Add(int32(2), uint32(100), int32(1), "rule", uint32(0), false, uint32(3), int64(1), int32(0), true, uint8(1))
	f.Add(int32(-1), uint32(0), int32(-9), "", uint32(7), true, uint32(0), int64(-1), int32(-1), false, uint8(5))
	f.Fuzz(func(t *testing.T, code int32, rpu uint32, unit int32, name string, mult uint32, hasMult bool, remaining uint32, secs int64, nanos int32, hasDur bool, n uint8) {
		r := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_Code(code)}
		for i := 0; i < int(n%8); i++ {
			r.Statuses = append(r.Statuses, plainStatus(code+int32(i), rpu, unit, name, mult, hasMult, remaining+uint32(i), secs, nanos, hasDur))
		}
		encodeBoth(t, r)
	})
}
